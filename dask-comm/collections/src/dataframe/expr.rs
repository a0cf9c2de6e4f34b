//! Column expressions for `filter`, `assign` and `select`: a small serialisable tree (a graph
//! carries it to the workers) that becomes a polars expression where a partition is read.

use std::ops;

use polars::prelude::{self as pl, NamedFrom, Series};
use serde::{Deserialize, Serialize};

/// A literal value in an expression.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Lit {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
}

impl From<bool> for Lit {
    fn from(v: bool) -> Lit {
        Lit::Bool(v)
    }
}
impl From<i64> for Lit {
    fn from(v: i64) -> Lit {
        Lit::Int(v)
    }
}
impl From<i32> for Lit {
    fn from(v: i32) -> Lit {
        Lit::Int(i64::from(v))
    }
}
impl From<f64> for Lit {
    fn from(v: f64) -> Lit {
        Lit::Float(v)
    }
}
impl From<&str> for Lit {
    fn from(v: &str) -> Lit {
        Lit::Str(v.to_string())
    }
}
impl From<String> for Lit {
    fn from(v: String) -> Lit {
        Lit::Str(v)
    }
}

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/` (true division: a float)
    Div,
    /// `%`
    Rem,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// logical and
    And,
    /// logical or
    Or,
}

/// An expression over a partition's columns.
///
/// ```
/// use dask_collections::dataframe::{col, lit};
/// let e = (col("x") * lit(2.0)).gt(lit(1.0)).and(col("name").is_in(["a", "b"]));
/// assert_eq!(e.columns(), vec!["name", "x"]);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Expr {
    /// A column by name.
    Col(String),
    /// A literal.
    Lit(Lit),
    /// Two expressions and an operator.
    Binary(Box<Expr>, BinOp, Box<Expr>),
    /// Logical not.
    Not(Box<Expr>),
    /// Whether the value is one of these.
    IsIn(Box<Expr>, Vec<Lit>),
    /// Whether the value is null.
    IsNull(Box<Expr>),
}

/// A column.
pub fn col(name: &str) -> Expr {
    Expr::Col(name.to_string())
}

/// A literal.
pub fn lit(v: impl Into<Lit>) -> Expr {
    Expr::Lit(v.into())
}

impl Expr {
    fn bin(self, op: BinOp, other: Expr) -> Expr {
        Expr::Binary(Box::new(self), op, Box::new(other))
    }

    /// `self == other`.
    pub fn eq(self, other: Expr) -> Expr {
        self.bin(BinOp::Eq, other)
    }
    /// `self != other`.
    pub fn ne(self, other: Expr) -> Expr {
        self.bin(BinOp::Ne, other)
    }
    /// `self < other`.
    pub fn lt(self, other: Expr) -> Expr {
        self.bin(BinOp::Lt, other)
    }
    /// `self <= other`.
    pub fn le(self, other: Expr) -> Expr {
        self.bin(BinOp::Le, other)
    }
    /// `self > other`.
    pub fn gt(self, other: Expr) -> Expr {
        self.bin(BinOp::Gt, other)
    }
    /// `self >= other`.
    pub fn ge(self, other: Expr) -> Expr {
        self.bin(BinOp::Ge, other)
    }
    /// Logical and.
    pub fn and(self, other: Expr) -> Expr {
        self.bin(BinOp::And, other)
    }
    /// Logical or.
    pub fn or(self, other: Expr) -> Expr {
        self.bin(BinOp::Or, other)
    }
    /// Logical not.
    #[allow(clippy::should_implement_trait)]
    pub fn not(self) -> Expr {
        Expr::Not(Box::new(self))
    }
    /// Whether the value is one of `values` (pandas' `isin`).
    pub fn is_in<L: Into<Lit>>(self, values: impl IntoIterator<Item = L>) -> Expr {
        Expr::IsIn(Box::new(self), values.into_iter().map(Into::into).collect())
    }
    /// Whether the value is null.
    pub fn is_null(self) -> Expr {
        Expr::IsNull(Box::new(self))
    }

    /// The columns the expression reads, sorted, each once.
    pub fn columns(&self) -> Vec<&str> {
        fn walk<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
            match e {
                Expr::Col(c) => out.push(c),
                Expr::Lit(_) => {}
                Expr::Binary(a, _, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                Expr::Not(a) | Expr::IsIn(a, _) | Expr::IsNull(a) => walk(a, out),
            }
        }
        let mut v = Vec::new();
        walk(self, &mut v);
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The polars expression.
    pub(crate) fn polars(&self) -> pl::Expr {
        match self {
            Expr::Col(c) => pl::col(c.as_str()),
            Expr::Lit(l) => lit_polars(l),
            Expr::Binary(a, op, b) => {
                let (a, b) = (a.polars(), b.polars());
                match op {
                    BinOp::Add => a + b,
                    BinOp::Sub => a - b,
                    BinOp::Mul => a * b,
                    BinOp::Div => a.cast(pl::DataType::Float64) / b.cast(pl::DataType::Float64),
                    BinOp::Rem => a % b,
                    BinOp::Eq => a.eq(b),
                    BinOp::Ne => a.neq(b),
                    BinOp::Lt => a.lt(b),
                    BinOp::Le => a.lt_eq(b),
                    BinOp::Gt => a.gt(b),
                    BinOp::Ge => a.gt_eq(b),
                    BinOp::And => a.and(b),
                    BinOp::Or => a.or(b),
                }
            }
            Expr::Not(a) => a.polars().not(),
            Expr::IsNull(a) => a.polars().is_null(),
            Expr::IsIn(a, values) => {
                let s = lits_series(values);
                a.polars().is_in(pl::lit(s).implode(true), false)
            }
        }
    }
}

fn lit_polars(l: &Lit) -> pl::Expr {
    match l {
        Lit::Bool(b) => pl::lit(*b),
        Lit::Int(i) => pl::lit(*i),
        Lit::Float(f) => pl::lit(*f),
        Lit::Str(s) => pl::lit(s.as_str()),
    }
}

/// The values of an `isin` as one series (of the first value's type; mixed lists become
/// strings).
fn lits_series(values: &[Lit]) -> Series {
    let name = "isin".into();
    if values.iter().all(|v| matches!(v, Lit::Int(_))) {
        let v: Vec<i64> = values
            .iter()
            .map(|v| if let Lit::Int(i) = v { *i } else { 0 })
            .collect();
        return Series::new(name, v);
    }
    if values
        .iter()
        .all(|v| matches!(v, Lit::Int(_) | Lit::Float(_)))
    {
        let v: Vec<f64> = values
            .iter()
            .map(|v| match v {
                Lit::Int(i) => *i as f64,
                Lit::Float(f) => *f,
                _ => 0.0,
            })
            .collect();
        return Series::new(name, v);
    }
    if values.iter().all(|v| matches!(v, Lit::Bool(_))) {
        let v: Vec<bool> = values
            .iter()
            .map(|v| matches!(v, Lit::Bool(true)))
            .collect();
        return Series::new(name, v);
    }
    let v: Vec<String> = values
        .iter()
        .map(|v| match v {
            Lit::Str(s) => s.clone(),
            Lit::Int(i) => i.to_string(),
            Lit::Float(f) => f.to_string(),
            Lit::Bool(b) => b.to_string(),
        })
        .collect();
    Series::new(name, v)
}

macro_rules! arith {
    ($($tr:ident $f:ident $op:ident),*) => {$(
        impl ops::$tr for Expr {
            type Output = Expr;
            fn $f(self, rhs: Expr) -> Expr {
                self.bin(BinOp::$op, rhs)
            }
        }
    )*};
}
arith!(Add add Add, Sub sub Sub, Mul mul Mul, Div div Div, Rem rem Rem);
