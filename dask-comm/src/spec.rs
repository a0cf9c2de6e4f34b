//! A task's spec on the wire: what a worker runs, as a [`Payload`]. The header holds the task
//! (function names, key arguments, nesting) with its literal values' metadata; the literal
//! values' bytes are the payload's frames. The scheduler never decodes it: it only forwards it
//! to the worker that runs the task.

use dask_graph::{Arg, DataError, Key, Name, Node, Task, Value, ValueMeta, WireValue};
use serde::{Deserialize, Serialize};

use crate::protocol::Payload;

#[derive(Serialize, Deserialize)]
enum WireArg {
    Key(Key),
    Lit(u32),
    List(Vec<WireArg>),
    Task(Box<WireTask>),
}

#[derive(Serialize, Deserialize)]
struct WireTask {
    func: Name,
    args: Vec<WireArg>,
    origin: Option<Key>,
}

#[derive(Serialize, Deserialize)]
enum WireNode {
    Task(WireTask),
    Value(u32),
}

#[derive(Serialize, Deserialize)]
struct WireSpec {
    node: WireNode,
    literals: Vec<ValueMeta>,
}

struct Literals {
    metas: Vec<ValueMeta>,
    frames: Vec<dask_graph::Frame>,
}

impl Literals {
    fn add(&mut self, v: &Value) -> Result<u32, DataError> {
        let (meta, frames) = v.encode()?.split();
        self.metas.push(meta);
        self.frames.extend(frames);
        Ok(self.metas.len() as u32 - 1)
    }
}

fn arg_out(a: &Arg, lits: &mut Literals) -> Result<WireArg, DataError> {
    Ok(match a {
        Arg::Key(k) => WireArg::Key(*k),
        Arg::Lit(v) => WireArg::Lit(lits.add(v)?),
        Arg::List(items) => WireArg::List(
            items
                .iter()
                .map(|a| arg_out(a, lits))
                .collect::<Result<_, _>>()?,
        ),
        Arg::Task(t) => WireArg::Task(Box::new(task_out(t, lits)?)),
    })
}

fn task_out(t: &Task, lits: &mut Literals) -> Result<WireTask, DataError> {
    Ok(WireTask {
        func: t.func,
        args: t
            .args
            .iter()
            .map(|a| arg_out(a, lits))
            .collect::<Result<_, _>>()?,
        origin: t.origin,
    })
}

/// Encodes a graph node (a task, or a value) as a spec.
pub fn encode(node: &Node) -> Result<Payload, DataError> {
    let mut lits = Literals {
        metas: Vec::new(),
        frames: Vec::new(),
    };
    let node = match node {
        Node::Task(t) => WireNode::Task(task_out(t, &mut lits)?),
        Node::Value(v) => WireNode::Value(lits.add(v)?),
    };
    let header = postcard::to_stdvec(&WireSpec {
        node,
        literals: lits.metas,
    })
    .map_err(|e| DataError::Encode {
        type_name: "task spec",
        reason: e.to_string(),
    })?;
    Ok(Payload {
        header,
        nframes: lits.frames.len() as u32,
        frames: lits.frames,
    })
}

fn arg_in(a: WireArg, lits: &[Value]) -> Result<Arg, DataError> {
    let bad = |i: u32| DataError::Decode {
        type_name: "task spec".into(),
        reason: format!("literal {i} of {}", lits.len()),
    };
    Ok(match a {
        WireArg::Key(k) => Arg::Key(k),
        WireArg::Lit(i) => Arg::Lit(lits.get(i as usize).cloned().ok_or_else(|| bad(i))?),
        WireArg::List(items) => Arg::List(
            items
                .into_iter()
                .map(|a| arg_in(a, lits))
                .collect::<Result<_, _>>()?,
        ),
        WireArg::Task(t) => Arg::Task(Box::new(task_in(*t, lits)?)),
    })
}

fn task_in(t: WireTask, lits: &[Value]) -> Result<Task, DataError> {
    Ok(Task {
        func: t.func,
        args: t
            .args
            .into_iter()
            .map(|a| arg_in(a, lits))
            .collect::<Result<_, _>>()?,
        origin: t.origin,
        shuffle: None,
    })
}

/// Decodes a spec back into a graph node (literal values decoded by their registered types).
pub fn decode(p: &Payload) -> Result<Node, DataError> {
    let spec: WireSpec = postcard::from_bytes(&p.header).map_err(|e| DataError::Decode {
        type_name: "task spec".into(),
        reason: e.to_string(),
    })?;
    let total: usize = spec.literals.iter().map(|m| m.frames as usize).sum();
    if total != p.frames.len() {
        return Err(DataError::Decode {
            type_name: "task spec".into(),
            reason: format!("{} frames for {total} announced", p.frames.len()),
        });
    }
    let mut frames = p.frames.iter().cloned();
    let mut lits = Vec::with_capacity(spec.literals.len());
    for meta in spec.literals {
        let f = frames.by_ref().take(meta.frames as usize).collect();
        lits.push(Value::decode(WireValue::join(meta, f))?);
    }
    Ok(match spec.node {
        WireNode::Task(t) => Node::Task(task_in(t, &lits)?),
        WireNode::Value(i) => {
            Node::Value(
                lits.get(i as usize)
                    .cloned()
                    .ok_or_else(|| DataError::Decode {
                        type_name: "task spec".into(),
                        reason: format!("value literal {i}"),
                    })?,
            )
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn specs_round_trip_with_literal_frames() {
        let t = Task::new(
            "f",
            [
                Arg::key(("x", 1)),
                Arg::lit(Bytes::from(vec![1u8; 1000])),
                Arg::List(vec![Arg::lit(2i64), Arg::key("y")]),
                Arg::Task(Box::new(Task::new("g", [Arg::lit("s".to_string())]))),
            ],
        );
        let p = encode(&Node::Task(t.clone())).unwrap();
        assert_eq!(p.frames.len(), 1, "the bytes literal is a frame");
        let Node::Task(back) = decode(&p).unwrap() else {
            panic!()
        };
        assert_eq!(format!("{back:?}"), format!("{t:?}"));
        let mut bad = p.clone();
        bad.frames.clear();
        assert!(decode(&bad).is_err());
        bad.header = vec![0xff; 3];
        assert!(decode(&bad).is_err());
    }
}
