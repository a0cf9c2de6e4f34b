//! Functions every process has: `identity` (any value, as is), `list` (its arguments as a
//! [`List`]) and `shuffle-barrier` (a shuffle's barrier: nothing, once its arguments exist).

use crate::registry::Registry;
use crate::value::{List, Value};

/// Registers the built-in functions in `r`.
pub(crate) fn register(r: &Registry) {
    r.register("identity", |v: Value| v);
    r.register_values("list", |args| Ok(Value::new(List(args.to_vec()))));
    r.register_values(crate::shuffle::BARRIER, |_| Ok(Value::new(())));
}
