//! The function registry: tasks name functions, and every process looks them up here.
//!
//! Every process of a cluster runs the same binary and registers the same functions at start
//! (before it starts or joins a cluster), so a graph never ships code. Typed adapters turn
//! plain Rust functions and closures of 0 to 6 arguments into functions over [`Value`]s, and
//! record their parameter and return types so that a graph passing the wrong type is refused
//! before it runs ([`Graph::validate`](crate::Graph::validate)).
//!
//! ```
//! use dask_graph::{registry, Value};
//! registry().register("inc-doc", |x: i64| x + 1);
//! registry().register("add-doc", |x: i64, y: i64| x + y);
//! registry().register_variadic("sum-doc", |xs: Vec<i64>| xs.iter().sum::<i64>());
//! let f = registry().get("add-doc").unwrap();
//! let out = f.call(&[Value::new(2i64), Value::new(3i64)]).unwrap();
//! assert_eq!(out.downcast_ref::<i64>(), Some(&5));
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, RwLock};

use crate::key::Name;
use crate::value::{register_type, Data, DataError, Expect, List, TypeInfo, Value};

/// A parameter type: how a [`Value`] becomes an argument.
///
/// Implemented for every [`Data`] type that is `Clone` (the value is cloned out; cheap for
/// scalars and reference-counted chunks), for `Arc<T>` of any [`Data`] type (shared, no
/// clone; the value must have been made with that `Arc`'s contents), and for [`Value`] itself
/// (anything).
pub trait FromValue: Sized + Send + 'static {
    /// What the parameter accepts.
    fn expect() -> Expect;
    /// Registers the types involved for decoding.
    fn register() {}
    /// The argument.
    fn from_value(v: &Value) -> Result<Self, DataError>;
}

fn mismatch(expected: impl fmt::Display, v: &Value) -> DataError {
    DataError::Mismatch {
        expected: expected.to_string(),
        got: v.type_info().name().to_string(),
    }
}

impl<T: Data + Clone> FromValue for T {
    fn expect() -> Expect {
        T::expect()
    }
    fn register() {
        register_type::<T>();
    }
    fn from_value(v: &Value) -> Result<Self, DataError> {
        if let Some(t) = v.downcast_ref::<T>() {
            return Ok(t.clone());
        }
        if let Some(list) = v.downcast_ref::<List>() {
            if let Some(r) = T::from_list(list) {
                return r;
            }
        }
        Err(mismatch(T::expect(), v))
    }
}

impl<T: Data> FromValue for Arc<T> {
    fn expect() -> Expect {
        Expect::Exactly(TypeInfo::of::<T>())
    }
    fn register() {
        register_type::<T>();
    }
    fn from_value(v: &Value) -> Result<Self, DataError> {
        v.downcast_arc::<T>()
            .ok_or_else(|| mismatch(TypeInfo::of::<T>(), v))
    }
}

impl FromValue for Value {
    fn expect() -> Expect {
        Expect::Any
    }
    fn from_value(v: &Value) -> Result<Self, DataError> {
        Ok(v.clone())
    }
}

/// A return type: how a function's result becomes a [`Value`] (or a task error).
///
/// Implemented for every [`Data`] type, for `Result<T, E>` with `E: Display` (an `Err` fails
/// the task with its text), and for [`Value`].
pub trait IntoValue: 'static {
    /// The type produced, when known before running (`None` for [`Value`]).
    fn produces() -> Option<TypeInfo>;
    /// Registers the types involved for decoding.
    fn register() {}
    /// The result.
    fn into_value(self) -> Result<Value, String>;
}

impl<T: Data> IntoValue for T {
    fn produces() -> Option<TypeInfo> {
        Some(TypeInfo::of::<T>())
    }
    fn register() {
        register_type::<T>();
    }
    fn into_value(self) -> Result<Value, String> {
        Ok(Value::new(self))
    }
}

impl<T: Data, E: fmt::Display + 'static> IntoValue for Result<T, E> {
    fn produces() -> Option<TypeInfo> {
        Some(TypeInfo::of::<T>())
    }
    fn register() {
        register_type::<T>();
    }
    fn into_value(self) -> Result<Value, String> {
        self.map(Value::new).map_err(|e| e.to_string())
    }
}

impl IntoValue for Value {
    fn produces() -> Option<TypeInfo> {
        None
    }
    fn into_value(self) -> Result<Value, String> {
        Ok(self)
    }
}

/// What a registered function's parameters are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Params {
    /// A fixed list of parameters.
    Fixed(Vec<Expect>),
    /// Any number of arguments, each of this type.
    Variadic(Expect),
}

type Call = Box<dyn Fn(&[Value]) -> Result<Value, CallError> + Send + Sync>;

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// The function returned an error (its text).
    #[error("{0}")]
    Failed(String),
    /// An argument was not of the parameter's type.
    #[error("argument {index}: {source}")]
    Argument {
        /// The argument's position.
        index: usize,
        /// What was wrong.
        source: DataError,
    },
    /// The wrong number of arguments.
    #[error("{got} arguments, expected {expected}")]
    Arity {
        /// Arguments given.
        got: usize,
        /// Parameters.
        expected: usize,
    },
}

/// A registered function.
pub struct Function {
    name: Name,
    params: Params,
    returns: Option<TypeInfo>,
    call: Call,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.name)
            .field("params", &self.params)
            .field("returns", &self.returns)
            .finish()
    }
}

impl Function {
    /// The function's name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// Its parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// What it returns, when known.
    pub fn returns(&self) -> Option<TypeInfo> {
        self.returns
    }

    /// Calls it. A panic is not caught here (the schedulers catch it).
    pub fn call(&self, args: &[Value]) -> Result<Value, CallError> {
        (self.call)(args)
    }
}

/// Functions of a fixed number of typed arguments (implemented for `Fn` closures of 0 to 6
/// arguments whose types implement [`FromValue`] and whose result implements [`IntoValue`]).
pub trait TypedFn<Args>: Send + Sync + 'static {
    /// The parameters.
    fn params() -> Vec<Expect>;
    /// The result type.
    fn returns() -> Option<TypeInfo>;
    /// Registers the argument and result types for decoding.
    fn register_types();
    /// Calls with converted arguments.
    fn call(&self, args: &[Value]) -> Result<Value, CallError>;
}

fn arg<T: FromValue>(args: &[Value], index: usize) -> Result<T, CallError> {
    T::from_value(&args[index]).map_err(|source| CallError::Argument { index, source })
}

macro_rules! typed_fn {
    ($($a:ident $i:tt),*) => {
        impl<F, R, $($a),*> TypedFn<($($a,)*)> for F
        where
            F: Fn($($a),*) -> R + Send + Sync + 'static,
            R: IntoValue,
            $($a: FromValue,)*
        {
            fn params() -> Vec<Expect> {
                vec![$($a::expect()),*]
            }
            fn returns() -> Option<TypeInfo> {
                R::produces()
            }
            fn register_types() {
                R::register();
                $($a::register();)*
            }
            fn call(&self, args: &[Value]) -> Result<Value, CallError> {
                let expected = Self::params().len();
                if args.len() != expected {
                    return Err(CallError::Arity { got: args.len(), expected });
                }
                self($(arg::<$a>(args, $i)?),*).into_value().map_err(CallError::Failed)
            }
        }
    };
}

typed_fn!();
typed_fn!(A0 0);
typed_fn!(A0 0, A1 1);
typed_fn!(A0 0, A1 1, A2 2);
typed_fn!(A0 0, A1 1, A2 2, A3 3);
typed_fn!(A0 0, A1 1, A2 2, A3 3, A4 4);
typed_fn!(A0 0, A1 1, A2 2, A3 3, A4 4, A5 5);

/// The process's functions, by name.
#[derive(Debug, Default)]
pub struct Registry {
    functions: RwLock<HashMap<Name, Arc<Function>>>,
}

/// The process-wide registry.
pub fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| {
        let r = Registry::default();
        crate::builtins::register(&r);
        r
    })
}

impl Registry {
    fn insert(&self, f: Function) {
        tracing::trace!(name = %f.name, "registered a function");
        self.functions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(f.name, Arc::new(f));
    }

    /// Registers `f` under `name` (replacing a function of that name).
    pub fn register<Args, F: TypedFn<Args>>(&self, name: &str, f: F) {
        F::register_types();
        self.insert(Function {
            name: Name::new(name),
            params: Params::Fixed(F::params()),
            returns: F::returns(),
            call: Box::new(move |args| f.call(args)),
        });
    }

    /// Registers a function over any number of arguments of one type (`sum(x0, x1, ...)`).
    pub fn register_variadic<A, R, F>(&self, name: &str, f: F)
    where
        A: FromValue,
        R: IntoValue,
        F: Fn(Vec<A>) -> R + Send + Sync + 'static,
    {
        A::register();
        R::register();
        self.insert(Function {
            name: Name::new(name),
            params: Params::Variadic(A::expect()),
            returns: R::produces(),
            call: Box::new(move |args| {
                let xs = args
                    .iter()
                    .enumerate()
                    .map(|(index, v)| {
                        A::from_value(v).map_err(|source| CallError::Argument { index, source })
                    })
                    .collect::<Result<Vec<A>, _>>()?;
                f(xs).into_value().map_err(CallError::Failed)
            }),
        });
    }

    /// Registers a function over raw values (any number, any types; nothing is checked before
    /// it runs).
    pub fn register_values<F>(&self, name: &str, f: F)
    where
        F: Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static,
    {
        self.insert(Function {
            name: Name::new(name),
            params: Params::Variadic(Expect::Any),
            returns: None,
            call: Box::new(move |args| f(args).map_err(CallError::Failed)),
        });
    }

    /// The function registered under `name`.
    pub fn get(&self, name: impl Into<Name>) -> Option<Arc<Function>> {
        self.functions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name.into())
            .cloned()
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_adapters_check_and_convert() {
        let r = Registry::default();
        r.register("t-zero", || 7u8);
        r.register("t-three", |a: i64, b: String, c: f64| format!("{a}{b}{c}"));
        r.register("t-fails", |x: i64| -> Result<i64, String> {
            if x < 0 {
                Err(format!("negative: {x}"))
            } else {
                Ok(x)
            }
        });
        let z = r.get("t-zero").unwrap();
        assert_eq!(z.call(&[]).unwrap().downcast_ref::<u8>(), Some(&7));
        let f = r.get("t-three").unwrap();
        assert_eq!(
            f.params(),
            &Params::Fixed(vec![
                Expect::Exactly(TypeInfo::of::<i64>()),
                Expect::Exactly(TypeInfo::of::<String>()),
                Expect::Exactly(TypeInfo::of::<f64>()),
            ])
        );
        let out = f
            .call(&[
                Value::new(1i64),
                Value::new("x".to_string()),
                Value::new(0.5f64),
            ])
            .unwrap();
        assert_eq!(out.downcast_ref::<String>().unwrap(), "1x0.5");
        let e = f
            .call(&[Value::new(1i64), Value::new(2i64), Value::new(0.5f64)])
            .unwrap_err();
        assert!(matches!(e, CallError::Argument { index: 1, .. }), "{e:?}");
        assert!(matches!(
            f.call(&[Value::new(1i64)]),
            Err(CallError::Arity {
                got: 1,
                expected: 3
            })
        ));
        let g = r.get("t-fails").unwrap();
        assert_eq!(
            g.call(&[Value::new(-1i64)]).unwrap_err(),
            CallError::Failed("negative: -1".into())
        );
    }

    #[test]
    fn lists_become_vectors_and_arcs_share() {
        let r = Registry::default();
        r.register("t-len", |xs: Vec<i64>| xs.len() as u64);
        let f = r.get("t-len").unwrap();
        let list = Value::new(List(vec![Value::new(1i64), Value::new(2i64)]));
        assert_eq!(f.call(&[list]).unwrap().downcast_ref::<u64>(), Some(&2));
        let whole = Value::new(vec![1i64, 2, 3]);
        assert_eq!(f.call(&[whole]).unwrap().downcast_ref::<u64>(), Some(&3));
        let bad = Value::new(List(vec![Value::new(1i64), Value::new(true)]));
        assert!(f.call(&[bad]).is_err());
        r.register("t-arc", |xs: Arc<Vec<i64>>| xs.as_ptr() as u64);
        let v = Value::new(vec![5i64; 4]);
        let ptr = v.downcast_ref::<Vec<i64>>().unwrap().as_ptr() as u64;
        let got = r.get("t-arc").unwrap().call(&[v]).unwrap();
        assert_eq!(got.downcast_ref::<u64>(), Some(&ptr), "shared, not cloned");
    }
}
