//! The function registry: tasks name functions, and every process looks them up here.
//!
//! Every process of a cluster runs the same binary and registers the same functions at start
//! (before it starts or joins a cluster), so a graph never ships code. Typed adapters turn
//! plain Rust functions and closures of 0 to 6 arguments into functions over [`Value`]s, and
//! record their parameter and return types so that a graph passing the wrong type is refused
//! before it runs ([`Graph::validate`](crate::Graph::validate)).
//!
//! Registering returns a [`Func`]: a handle that keeps the wire name and, in its type, what
//! the function takes and returns, so call sites pass the handle rather than repeat the
//! string (a typo is a compile error, and `Client::map` checks the item type). Names are
//! still accepted wherever a function is (`"inc"`), for names known only at run time.
//!
//! One name, one function: a second registration of a name from another place in the code is
//! refused ([`Registry::try_register`] says where both are; [`Registry::register`] panics
//! with that text). The same place registering again (a `register()` called once per
//! process and once per test) gets the first registration's handle.
//!
//! ```
//! use dask_graph::{registry, Func, Value};
//! let inc: Func<(i64,), i64> = registry().register("inc-doc", |x: i64| x + 1);
//! let add = registry().register("add-doc", |x: i64, y: i64| x + y);
//! let sum = registry().register_variadic("sum-doc", |xs: Vec<i64>| xs.iter().sum::<i64>());
//! assert_eq!(inc.name().as_str(), "inc-doc");
//! let out = registry().get(add).unwrap().call(&[Value::new(2i64), Value::new(3i64)]).unwrap();
//! assert_eq!(out.downcast_ref::<i64>(), Some(&5));
//! # let _ = sum;
//! // Another function under a name already taken is refused, naming both places.
//! let e = registry().try_register("inc-doc", |x: i64| x - 1).unwrap_err();
//! assert!(e.to_string().contains("registry.rs"), "{e}");
//! ```

use std::collections::HashMap;
use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;
use std::sync::{Arc, OnceLock, RwLock};

use crate::key::Name;
use crate::task::{Arg, Task};
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
    /// What a task of the function is worth (`T` for `T` and for `Result<T, E>`; [`Value`]
    /// for [`Value`]): the result type of its [`Func`].
    type Output: 'static;
    /// The type produced, when known before running (`None` for [`Value`]).
    fn produces() -> Option<TypeInfo>;
    /// Registers the types involved for decoding.
    fn register() {}
    /// The result.
    fn into_value(self) -> Result<Value, String>;
}

impl<T: Data> IntoValue for T {
    type Output = T;
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
    type Output = T;
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
    type Output = Value;
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
    /// What its tasks are worth (see [`IntoValue::Output`]).
    type Output: 'static;
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
            type Output = R::Output;
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

/// A registered function's handle: its wire name, and in its type its parameters (`Args`, a
/// tuple for a fixed list; [`Variadic<A>`] for any number of `A`; [`Values`] for raw values)
/// and what its tasks are worth (`R`). Cheap to copy; pass it wherever a function is named.
///
/// ```
/// use dask_graph::{registry, Arg, Func, Graph, Inline, Scheduler};
/// let double: Func<(i64,), i64> = registry().register("double-func-doc", |x: i64| 2 * x);
/// let mut g = Graph::new();
/// g.insert("x", double.task([Arg::lit(21i64)]));
/// let out = Inline.get(g, &["x".into()]).unwrap();
/// assert_eq!(out[0].downcast_ref::<i64>(), Some(&42));
/// ```
pub struct Func<Args, R> {
    name: Name,
    sig: PhantomData<fn(Args) -> R>,
}

/// The parameters of a function registered with [`Registry::register_variadic`]: any number
/// of `A`.
#[derive(Debug)]
pub struct Variadic<A>(PhantomData<fn() -> A>);

/// The parameters of a function registered with [`Registry::register_values`]: any values.
#[derive(Debug)]
pub struct Values;

impl<Args, R> Func<Args, R> {
    /// The handle of a function known to be registered under `name` with this signature (one
    /// registered in another module, or in every process by the same code). Nothing checks
    /// the signature here; [`Graph::validate`](crate::Graph::validate) does before a graph
    /// runs.
    pub fn named(name: &str) -> Func<Args, R> {
        Func {
            name: Name::new(name),
            sig: PhantomData,
        }
    }

    /// The wire name.
    pub fn name(&self) -> Name {
        self.name
    }

    /// A task calling it with `args` (keys, literals, lists, nested tasks).
    pub fn task(&self, args: impl IntoIterator<Item = Arg>) -> Task {
        Task::new(self.name, args)
    }
}

impl<Args, R> Clone for Func<Args, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Args, R> Copy for Func<Args, R> {}

impl<Args, R> PartialEq for Func<Args, R> {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl<Args, R> Eq for Func<Args, R> {}

impl<Args, R> fmt::Debug for Func<Args, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Func({})", self.name)
    }
}

impl<Args, R> From<Func<Args, R>> for Name {
    fn from(f: Func<Args, R>) -> Name {
        f.name
    }
}

impl<Args, R> From<&Func<Args, R>> for Name {
    fn from(f: &Func<Args, R>) -> Name {
        f.name
    }
}

/// A function as a call site names it, for calls whose parameters the call site states
/// (`Client::map` passes one item of type `T`: `Callable<(T,)>`): a [`Func`] handle, checked
/// when this compiles, or a name (`&str`, `String`, [`Name`]) for any parameters, checked when
/// the graph is validated.
///
/// ```
/// use dask_graph::{registry, Callable};
/// fn map<T>(f: impl Callable<(T,)>, items: Vec<T>) -> usize { items.len() }
/// let is_even = registry().register("is-even-callable-doc", |x: u64| x % 2 == 0);
/// assert_eq!(map(is_even, vec![1u64, 2]), 2);
/// assert_eq!(map("is-even-callable-doc", vec!["checked later"]), 1);
/// ```
///
/// A handle and items of another type do not compile:
///
/// ```compile_fail
/// use dask_graph::{registry, Callable};
/// fn map<T>(f: impl Callable<(T,)>, items: Vec<T>) -> usize { items.len() }
/// let is_even = registry().register("is-even-callable-doc", |x: u64| x % 2 == 0);
/// map(is_even, vec!["not a number"]);
/// ```
pub trait Callable<Args> {
    /// The function's wire name.
    fn func_name(&self) -> Name;
}

impl<Args, R> Callable<Args> for Func<Args, R> {
    fn func_name(&self) -> Name {
        self.name
    }
}

impl<Args, R> Callable<Args> for &Func<Args, R> {
    fn func_name(&self) -> Name {
        self.name
    }
}

impl<Args> Callable<Args> for &str {
    fn func_name(&self) -> Name {
        Name::new(self)
    }
}

impl<Args> Callable<Args> for String {
    fn func_name(&self) -> Name {
        Name::new(self)
    }
}

impl<Args> Callable<Args> for &String {
    fn func_name(&self) -> Name {
        Name::new(self)
    }
}

impl<Args> Callable<Args> for Name {
    fn func_name(&self) -> Name {
        *self
    }
}

/// A name registered twice, from two places in the code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the function name `{name}` is taken: registered at {first}, registered again at {second}")]
pub struct DuplicateName {
    /// The name.
    pub name: String,
    /// Where it was registered first (`file:line:column`).
    pub first: String,
    /// Where the refused registration was made.
    pub second: String,
}

/// What a name is registered as.
enum Registered {
    /// A function tasks call.
    Task(Arc<Function>),
    /// A function a collection runs in its own form (see [`Registry::register_native`]).
    Native(Arc<dyn std::any::Any + Send + Sync>),
}

struct Entry {
    what: Registered,
    at: &'static Location<'static>,
}

/// The process's functions, by name: one table for the graph's tasks and every collection.
#[derive(Default)]
pub struct Registry {
    functions: RwLock<HashMap<Name, Entry>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self
            .functions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        f.debug_struct("Registry").field("functions", &n).finish()
    }
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
    /// Takes `name` for `what`, registered `at`; the same place again keeps the first.
    fn claim(
        &self,
        name: Name,
        what: impl FnOnce() -> Registered,
        at: &'static Location<'static>,
    ) -> Result<(), DuplicateName> {
        let mut table = self.functions.write().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = table.get(&name) {
            if e.at == at {
                return Ok(());
            }
            let err = DuplicateName {
                name: name.as_str().to_string(),
                first: e.at.to_string(),
                second: at.to_string(),
            };
            tracing::warn!(%err, "a function registration refused");
            return Err(err);
        }
        tracing::trace!(%name, %at, "registered a function");
        table.insert(name, Entry { what: what(), at });
        Ok(())
    }

    fn insert<Args, R>(
        &self,
        f: Function,
        at: &'static Location<'static>,
    ) -> Result<Func<Args, R>, DuplicateName> {
        let name = f.name;
        self.claim(name, || Registered::Task(Arc::new(f)), at)?;
        Ok(Func {
            name,
            sig: PhantomData,
        })
    }

    /// Registers `native` under `name`: a function a collection runs in its own form (a bag's
    /// `Fn(&Item) -> Item`, a dataframe's partition function) inside its tasks, not as a task
    /// of its own. It shares the one name table: a name taken by a task function or another
    /// collection's is refused, as [`Registry::try_register`] refuses. [`Registry::native`]
    /// finds it; [`Registry::get`] does not (a task cannot call it).
    #[track_caller]
    pub fn register_native<T: std::any::Any + Send + Sync>(
        &self,
        name: &str,
        native: T,
    ) -> Result<Name, DuplicateName> {
        let name = Name::new(name);
        self.claim(
            name,
            || Registered::Native(Arc::new(native)),
            Location::caller(),
        )?;
        Ok(name)
    }

    /// The function registered under `name` with [`Registry::register_native`], if it is a
    /// `T` (`None` when the name is not registered, or is registered as something else).
    pub fn native<T: std::any::Any + Send + Sync>(&self, name: impl Into<Name>) -> Option<Arc<T>> {
        let table = self.functions.read().unwrap_or_else(|e| e.into_inner());
        match &table.get(&name.into())?.what {
            Registered::Native(n) => Arc::clone(n).downcast::<T>().ok(),
            Registered::Task(_) => None,
        }
    }

    fn typed<Args, F: TypedFn<Args>>(name: &str, f: F) -> Function {
        F::register_types();
        Function {
            name: Name::new(name),
            params: Params::Fixed(F::params()),
            returns: F::returns(),
            call: Box::new(move |args| f.call(args)),
        }
    }

    /// Registers `f` under `name` and returns its handle.
    ///
    /// # Panics
    ///
    /// When another place in the code registered `name` (see [`Registry::try_register`]).
    #[track_caller]
    pub fn register<Args, F: TypedFn<Args>>(&self, name: &str, f: F) -> Func<Args, F::Output> {
        let at = Location::caller();
        self.insert(Self::typed(name, f), at)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Registers `f` under `name`; refused when another place in the code registered it (the
    /// same place registering again gets the handle of its first registration, which stays).
    #[track_caller]
    pub fn try_register<Args, F: TypedFn<Args>>(
        &self,
        name: &str,
        f: F,
    ) -> Result<Func<Args, F::Output>, DuplicateName> {
        self.insert(Self::typed(name, f), Location::caller())
    }

    /// Registers a function over any number of arguments of one type (`sum(x0, x1, ...)`).
    ///
    /// # Panics
    ///
    /// As [`Registry::register`].
    #[track_caller]
    pub fn register_variadic<A, R, F>(&self, name: &str, f: F) -> Func<Variadic<A>, R::Output>
    where
        A: FromValue,
        R: IntoValue,
        F: Fn(Vec<A>) -> R + Send + Sync + 'static,
    {
        A::register();
        R::register();
        let function = Function {
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
        };
        self.insert(function, Location::caller())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Registers a function over raw values (any number, any types; nothing is checked before
    /// it runs).
    ///
    /// # Panics
    ///
    /// As [`Registry::register`].
    #[track_caller]
    pub fn register_values<F>(&self, name: &str, f: F) -> Func<Values, Value>
    where
        F: Fn(&[Value]) -> Result<Value, String> + Send + Sync + 'static,
    {
        let function = Function {
            name: Name::new(name),
            params: Params::Variadic(Expect::Any),
            returns: None,
            call: Box::new(move |args| f(args).map_err(CallError::Failed)),
        };
        self.insert(function, Location::caller())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The function registered under `name` (a [`Func`] or its text).
    pub fn get(&self, name: impl Into<Name>) -> Option<Arc<Function>> {
        self.functions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&name.into())
            .and_then(|e| match &e.what {
                Registered::Task(f) => Some(f.clone()),
                Registered::Native(_) => None,
            })
    }

    /// Whether `name` is registered.
    pub fn contains(&self, name: impl Into<Name>) -> bool {
        self.functions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(&name.into())
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Name {
        Name::new(s)
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Name {
        Name::new(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Name {
        Name::new(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register_inc(r: &Registry) -> Result<Func<(i64,), i64>, DuplicateName> {
        r.try_register("t-inc", |x: i64| x + 1)
    }

    #[test]
    fn a_name_is_one_function() {
        let r = Registry::default();
        // The same place registering again (a `register()` run twice) gets the same handle.
        let first = register_inc(&r).unwrap();
        let again = register_inc(&r).unwrap();
        assert_eq!(first, again);
        assert_eq!(first.name().as_str(), "t-inc");
        // Another place is refused, naming both; the first registration stays.
        let e = r.try_register("t-inc", |x: i64| x - 1).unwrap_err();
        assert_eq!(e.name, "t-inc");
        assert!(e.first.contains("registry.rs"), "{e}");
        assert_ne!(e.first, e.second);
        assert!(e.to_string().contains(&e.first) && e.to_string().contains(&e.second));
        let out = r.get(first).unwrap().call(&[Value::new(1i64)]).unwrap();
        assert_eq!(out.downcast_ref::<i64>(), Some(&2));
        // Kinds of registration share the one table.
        let e = r
            .try_register("t-inc", |xs: Vec<i64>| xs.len() as i64)
            .unwrap_err();
        assert_eq!(e.name, "t-inc");
    }

    #[test]
    fn native_functions_share_the_table() {
        let r = Registry::default();
        #[derive(Debug, PartialEq)]
        struct Mine(u32);
        let n = r.register_native("t-native", Mine(7)).unwrap();
        assert_eq!(r.native::<Mine>(n).as_deref(), Some(&Mine(7)));
        assert!(r.native::<String>("t-native").is_none());
        assert!(r.get("t-native").is_none(), "not a task function");
        assert!(r.contains("t-native"));
        // One table: a task function cannot take a native's name, nor the reverse.
        let e = r.try_register("t-native", || 1u8).unwrap_err();
        assert_eq!(e.name, "t-native");
        r.register("t-task", || 1u8);
        assert!(r.register_native("t-task", Mine(1)).is_err());
        assert!(r.native::<Mine>("t-task").is_none());
    }

    #[test]
    #[should_panic(expected = "the function name `t-dup` is taken")]
    fn register_panics_on_a_taken_name() {
        let r = Registry::default();
        r.register("t-dup", || 1u8);
        r.register("t-dup", || 2u8);
    }

    #[test]
    fn handles_name_tasks_and_calls() {
        let r = Registry::default();
        let add: Func<(i64, i64), i64> = r.register("t-add", |x: i64, y: i64| x + y);
        let t = add.task([Arg::lit(1i64), Arg::key("y")]);
        assert_eq!(t.func, add.name());
        assert_eq!(Callable::<(i64, i64)>::func_name(&add), Name::new("t-add"));
        assert_eq!(Callable::<(u8,)>::func_name(&"t-add"), add.name());
        let v: Func<Variadic<i64>, i64> =
            r.register_variadic("t-sum", |xs: Vec<i64>| xs.len() as i64);
        let w: Func<Values, Value> = r.register_values("t-raw", |a| Ok(a[0].clone()));
        assert!(r.contains(v) && r.contains(w) && !r.contains("t-none"));
        assert_eq!(Func::<(i64, i64), i64>::named("t-add"), add);
    }

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
