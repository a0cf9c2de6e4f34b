//! Tasks: a function's name and its arguments (keys, literal values, lists, nested tasks).

use std::fmt;

use crate::key::{Key, Name};
use crate::shuffle::ShuffleRole;
use crate::value::{Data, Value};

/// One argument of a task.
#[derive(Clone)]
pub enum Arg {
    /// The value of another key.
    Key(Key),
    /// A literal value.
    Lit(Value),
    /// A list of arguments: the function receives a [`List`](crate::List) of their values (a
    /// `Vec<T>` parameter accepts it).
    List(Vec<Arg>),
    /// The result of a nested task, run first (what `inline` and `fuse` make).
    Task(Box<Task>),
}

impl Arg {
    /// A literal value.
    pub fn lit<T: Data>(v: T) -> Arg {
        Arg::Lit(Value::new(v))
    }

    /// A reference to `key`'s value.
    pub fn key(key: impl Into<Key>) -> Arg {
        Arg::Key(key.into())
    }

    /// Calls `f` with every key this argument refers to (nested ones too).
    pub fn for_each_key(&self, f: &mut impl FnMut(Key)) {
        match self {
            Arg::Key(k) => f(*k),
            Arg::Lit(_) => {}
            Arg::List(items) => items.iter().for_each(|a| a.for_each_key(f)),
            Arg::Task(t) => t.for_each_key(f),
        }
    }

    fn map_keys(&mut self, f: &mut impl FnMut(Key) -> Option<Arg>) {
        match self {
            Arg::Key(k) => {
                if let Some(a) = f(*k) {
                    *self = a;
                }
            }
            Arg::Lit(_) => {}
            Arg::List(items) => items.iter_mut().for_each(|a| a.map_keys(f)),
            Arg::Task(t) => t.map_keys(f),
        }
    }
}

impl From<Key> for Arg {
    fn from(k: Key) -> Arg {
        Arg::Key(k)
    }
}

impl From<Task> for Arg {
    fn from(t: Task) -> Arg {
        Arg::Task(Box::new(t))
    }
}

impl From<Value> for Arg {
    fn from(v: Value) -> Arg {
        Arg::Lit(v)
    }
}

impl fmt::Debug for Arg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Key(k) => write!(f, "{k}"),
            Arg::Lit(v) => write!(f, "{v:?}"),
            Arg::List(items) => f.debug_list().entries(items).finish(),
            Arg::Task(t) => write!(f, "{t:?}"),
        }
    }
}

/// A call of a registered function.
///
/// ```
/// use dask_graph::{Arg, Key, Task};
/// let t = Task::new("add", [Arg::key(("x", 0)), Arg::lit(1i64)]);
/// assert_eq!(t.dependencies(), vec![Key::new("x", &[0])]);
/// ```
#[derive(Clone)]
pub struct Task {
    /// The function's name (see [`registry`](crate::registry)).
    pub func: Name,
    /// The arguments, in order.
    pub args: Vec<Arg>,
    /// For a task nested by `fuse` or `inline`: the key it had, which its failures name.
    pub origin: Option<Key>,
    /// Its part in a shuffle (see [`shuffle`](crate::shuffle)): such a task is never nested
    /// into another.
    pub shuffle: Option<ShuffleRole>,
}

impl Task {
    /// A call of `func` (a [`Func`](crate::Func) handle, or a function's name) with `args`.
    pub fn new(func: impl Into<Name>, args: impl IntoIterator<Item = Arg>) -> Task {
        Task {
            func: func.into(),
            args: args.into_iter().collect(),
            origin: None,
            shuffle: None,
        }
    }

    /// The same task, marked with its part in a shuffle.
    pub fn with_shuffle(mut self, role: ShuffleRole) -> Task {
        self.shuffle = Some(role);
        self
    }

    /// Calls `f` with every key the task refers to, nested ones included, repeats included.
    pub fn for_each_key(&self, f: &mut impl FnMut(Key)) {
        self.args.iter().for_each(|a| a.for_each_key(f));
    }

    /// The keys the task needs, each once, in the order they first appear.
    pub fn dependencies(&self) -> Vec<Key> {
        let mut out = Vec::new();
        let mut seen = rustc_hash::FxHashSet::default();
        self.for_each_key(&mut |k| {
            if seen.insert(k) {
                out.push(k);
            }
        });
        out
    }

    /// Replaces key arguments for which `f` returns an argument.
    pub(crate) fn map_keys(&mut self, f: &mut impl FnMut(Key) -> Option<Arg>) {
        self.args.iter_mut().for_each(|a| a.map_keys(f));
    }

    /// How deeply tasks nest in this one (1 for a task without nested tasks).
    pub fn depth(&self) -> usize {
        fn arg_depth(a: &Arg) -> usize {
            match a {
                Arg::Task(t) => t.depth(),
                Arg::List(items) => items.iter().map(arg_depth).max().unwrap_or(0),
                _ => 0,
            }
        }
        1 + self.args.iter().map(arg_depth).max().unwrap_or(0)
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}(", self.func)?;
        for (i, a) in self.args.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{a:?}")?;
        }
        f.write_str(")")
    }
}

/// What a key of a graph holds: a task to run, or a value already known.
#[derive(Clone, Debug)]
pub enum Node {
    /// A task.
    Task(Task),
    /// A value (Dask's `{"x": 1}`).
    Value(Value),
}

impl From<Task> for Node {
    fn from(t: Task) -> Node {
        Node::Task(t)
    }
}

impl From<Value> for Node {
    fn from(v: Value) -> Node {
        Node::Value(v)
    }
}

impl Node {
    /// The keys this node needs.
    pub fn dependencies(&self) -> Vec<Key> {
        match self {
            Node::Task(t) => t.dependencies(),
            Node::Value(_) => Vec::new(),
        }
    }
}
