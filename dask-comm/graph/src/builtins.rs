//! Functions every process has: `identity` (any value, as is) and `list` (its arguments as a
//! [`List`]).

use crate::registry::Registry;
use crate::value::{List, Value};

/// Registers the built-in functions in `r`.
pub(crate) fn register(r: &Registry) {
    r.register("identity", |v: Value| v);
    r.register_values("list", |args| Ok(Value::new(List(args.to_vec()))));
}
