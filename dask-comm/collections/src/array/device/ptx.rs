//! PTX for the device kernels of arrays, generated as text: one small module per kernel, loaded
//! by the CUDA driver (which compiles PTX for the GPU it finds), so neither nvcc nor NVRTC is
//! needed to build or to run, as `examples/gpu_echo.rs` does by hand.
//!
//! Every kernel walks its elements with a grid-stride loop (any grid covers any length), loads
//! each operand as its own type, converts it to the type the operation is computed in, and
//! converts the result to the type stored. The conversions are NumPy's `astype` with unsafe
//! casting, as the host kernels do: floats to integers truncate toward zero, wider integers
//! to narrower wrap, integers to floats round to nearest.
//!
//! The text is checked without a GPU: unit tests here read it, and a drill assembles every
//! kernel with `ptxas` (``ptx::tests::ptxas_assembles_every_kernel`, a drill`).

use std::fmt::Write;

use crate::array::{BinaryOp, DType, UnaryOp};

/// Element types kernels take: the numeric types of 4 and 8 bytes.
pub(crate) const TYPES: [DType; 4] = [DType::I32, DType::I64, DType::F32, DType::F64];

/// Whether device kernels take elements of `t`.
pub(crate) fn supported(t: DType) -> bool {
    TYPES.contains(&t)
}

/// PTX's name for the type (`s32`, `f64`, ...).
fn ty(t: DType) -> &'static str {
    match t {
        DType::I32 => "s32",
        DType::I64 => "s64",
        DType::F32 => "f32",
        DType::F64 => "f64",
        // Refused before any kernel is asked for (`supported`).
        DType::Bool | DType::U8 => unreachable!("no device kernels for {}", t.name()),
    }
}

/// Register `k` of type `t` (each type has its own bank, `%i`, `%l`, `%f`, `%d`).
fn reg(t: DType, k: u8) -> String {
    let bank = match t {
        DType::I32 => "i",
        DType::I64 => "l",
        DType::F32 => "f",
        _ => "d",
    };
    format!("%{bank}{k}")
}

/// The instruction that puts `src` (of `from`) into `dst` (of `to`).
fn convert(to: DType, dst: &str, from: DType, src: &str) -> String {
    let (t, f) = (ty(to), ty(from));
    let op = match (to.is_float(), from.is_float()) {
        _ if to == from => return format!("mov.{t} {dst}, {src};"),
        (false, false) => format!("cvt.{t}.{f}"),
        (true, false) => format!("cvt.rn.{t}.{f}"),
        (false, true) => format!("cvt.rzi.{t}.{f}"),
        // f32 -> f64 is exact; f64 -> f32 rounds.
        (true, true) if to == DType::F64 => format!("cvt.{t}.{f}"),
        (true, true) => format!("cvt.rn.{t}.{f}"),
    };
    format!("{op} {dst}, {src};")
}

/// A literal of type `t` (PTX spells float literals as their bits: `0d...`, `0f...`).
fn literal(t: DType, v: f64) -> String {
    match t {
        DType::F64 => format!("0d{:016X}", v.to_bits()),
        DType::F32 => format!("0f{:08X}", (v as f32).to_bits()),
        _ => format!("{}", v as i64),
    }
}

/// The module's header and the entry's opening, with every register bank declared.
fn open(out: &mut String, name: &str, params: &[&str]) {
    let params: Vec<String> = params.iter().map(|p| format!(".param {p}")).collect();
    let _ = write!(
        out,
        ".version 7.0\n.target sm_52\n.address_size 64\n\n\
         .visible .entry {name}({})\n{{\n\
         \t.reg .pred %p<2>;\n\t.reg .b32 %t<4>;\n\t.reg .u64 %u<16>;\n\
         \t.reg .s32 %i<8>;\n\t.reg .s64 %l<8>;\n\t.reg .f32 %f<8>;\n\t.reg .f64 %d<8>;\n",
        params.join(", ")
    );
}

/// `%u4` = this thread's first element, `%u5` = the grid's stride; then the loop's head, which
/// leaves for `DONE` once `%u4` reaches `%u3` (the element count).
fn grid_stride_loop(out: &mut String) {
    out.push_str(
        "\tmov.u32 %t0, %ctaid.x;\n\tmov.u32 %t1, %ntid.x;\n\tmov.u32 %t2, %tid.x;\n\
         \tmov.u32 %t3, %nctaid.x;\n\tmul.wide.u32 %u4, %t0, %t1;\n\tcvt.u64.u32 %u6, %t2;\n\
         \tadd.u64 %u4, %u4, %u6;\n\tmul.wide.u32 %u5, %t3, %t1;\n\
         LOOP:\n\tsetp.ge.u64 %p0, %u4, %u3;\n\t@%p0 bra DONE;\n",
    );
}

/// The loop's tail: the next element, and the exit.
fn close_loop(out: &mut String) {
    out.push_str("\tadd.u64 %u4, %u4, %u5;\n\tbra LOOP;\nDONE:\n\tret;\n}\n");
}

/// `dst` = the address of element `%u4` of the array at `base`, `t`'s size apart.
fn address(out: &mut String, dst: &str, base: &str, t: DType) {
    let _ = writeln!(
        out,
        "\tmul.lo.u64 {dst}, %u4, {};\n\tadd.u64 {dst}, {dst}, {base};",
        t.size()
    );
}

/// Loads the parameters named `names` (device pointers are made global) into `%u0`, `%u1`, ...
fn load_params(out: &mut String, pointers: &[&str], count: &str) {
    for (i, p) in pointers.iter().enumerate() {
        let _ = writeln!(
            out,
            "\tld.param.u64 %u{i}, [{p}];\n\tcvta.to.global.u64 %u{i}, %u{i};"
        );
    }
    let _ = writeln!(out, "\tld.param.u64 %u3, [{count}];");
}

/// A kernel: its entry's name and its module's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kernel {
    /// The entry's name (unique among every kernel generated here).
    pub name: String,
    /// The module.
    pub ptx: String,
}

/// The instruction computing `op` in `c` (`dst` = `a` op `b`).
fn binary_instr(op: BinaryOp, c: DType, dst: &str, a: &str, b: &str) -> String {
    let t = ty(c);
    let mnemonic = match op {
        BinaryOp::Add => format!("add.{t}"),
        BinaryOp::Sub => format!("sub.{t}"),
        BinaryOp::Mul if c.is_float() => format!("mul.rn.{t}"),
        BinaryOp::Mul => format!("mul.lo.{t}"),
        BinaryOp::Div => format!("div.rn.{t}"),
        BinaryOp::Maximum => format!("max.{t}"),
        BinaryOp::Minimum => format!("min.{t}"),
        _ => unreachable!("{op:?} is refused before a kernel is asked for"),
    };
    format!("{mnemonic} {dst}, {a}, {b};")
}

/// Binary operations with device kernels.
pub(crate) fn binary_supported(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Add | Sub | Mul | Div | Maximum | Minimum)
}

/// `out[i] = a[i] op b[i]` for operands of `a` and `b`, computed and stored as `r`
/// (`op.result(a, b)`). Parameters: `(a, b, out, n)`.
pub(crate) fn binary(op: BinaryOp, a: DType, b: DType) -> Kernel {
    let r = op.result(a, b);
    let name = format!("binary_{op:?}_{}_{}", ty(a), ty(b)).to_lowercase();
    let mut s = String::new();
    open(&mut s, &name, &[".u64 a", ".u64 b", ".u64 out", ".u64 n"]);
    load_params(&mut s, &["a", "b", "out"], "n");
    grid_stride_loop(&mut s);
    address(&mut s, "%u7", "%u0", a);
    let _ = writeln!(s, "\tld.global.{} {}, [%u7];", ty(a), reg(a, 0));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 1), a, &reg(a, 0)));
    address(&mut s, "%u8", "%u1", b);
    let _ = writeln!(s, "\tld.global.{} {}, [%u8];", ty(b), reg(b, 2));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 3), b, &reg(b, 2)));
    let _ = writeln!(
        s,
        "\t{}",
        binary_instr(op, r, &reg(r, 4), &reg(r, 1), &reg(r, 3))
    );
    address(&mut s, "%u9", "%u2", r);
    let _ = writeln!(s, "\tst.global.{} [%u9], {};", ty(r), reg(r, 4));
    close_loop(&mut s);
    Kernel { name, ptx: s }
}

/// `out[i] = a[i] op s` (or `s op a[i]` when `scalar_first`), the scalar given as an `f64`
/// parameter of type `st` (its value already of that type). Parameters: `(a, out, s, n)`.
pub(crate) fn scalar(op: BinaryOp, a: DType, st: DType, scalar_first: bool) -> Kernel {
    let r = op.result(a, st);
    let order = if scalar_first { "sa" } else { "as" };
    let name = format!("scalar_{op:?}_{}_{}_{order}", ty(a), ty(st)).to_lowercase();
    let mut s = String::new();
    open(&mut s, &name, &[".u64 a", ".u64 out", ".f64 s", ".u64 n"]);
    load_params(&mut s, &["a", "out"], "n");
    // The scalar, in the computation's type, once: `%d6` -> register 3 of `r`.
    s.push_str("\tld.param.f64 %d6, [s];\n");
    let _ = writeln!(s, "\t{}", convert(st, &reg(st, 7), DType::F64, "%d6"));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 3), st, &reg(st, 7)));
    grid_stride_loop(&mut s);
    address(&mut s, "%u7", "%u0", a);
    let _ = writeln!(s, "\tld.global.{} {}, [%u7];", ty(a), reg(a, 0));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 1), a, &reg(a, 0)));
    let (x, y) = if scalar_first {
        (reg(r, 3), reg(r, 1))
    } else {
        (reg(r, 1), reg(r, 3))
    };
    let _ = writeln!(s, "\t{}", binary_instr(op, r, &reg(r, 4), &x, &y));
    address(&mut s, "%u9", "%u1", r);
    let _ = writeln!(s, "\tst.global.{} [%u9], {};", ty(r), reg(r, 4));
    close_loop(&mut s);
    Kernel { name, ptx: s }
}

/// Unary operations with device kernels (PTX has exact `sqrt` and rounding, but only
/// approximate single-precision transcendental functions, which NumPy's results would not
/// match).
pub(crate) fn unary_supported(op: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(op, Neg | Abs | Sqrt | Floor | Ceil)
}

/// `out[i] = op(a[i])` (`None`: a conversion to `to`, NumPy's `astype`), stored as `op`'s
/// result type. Parameters: `(a, out, n)`.
pub(crate) fn unary(op: Option<UnaryOp>, a: DType, to: DType) -> Kernel {
    let r = op.map_or(to, |op| op.result(a));
    let what = op.map_or("astype".to_string(), |op| format!("{op:?}"));
    let name = format!("unary_{what}_{}_{}", ty(a), ty(r)).to_lowercase();
    let mut s = String::new();
    open(&mut s, &name, &[".u64 a", ".u64 out", ".u64 n"]);
    load_params(&mut s, &["a", "out"], "n");
    grid_stride_loop(&mut s);
    address(&mut s, "%u7", "%u0", a);
    let _ = writeln!(s, "\tld.global.{} {}, [%u7];", ty(a), reg(a, 0));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 1), a, &reg(a, 0)));
    let (t, x, y) = (ty(r), reg(r, 1), reg(r, 4));
    let instr = match op {
        None => format!("mov.{t} {y}, {x};"),
        Some(UnaryOp::Neg) => format!("neg.{t} {y}, {x};"),
        Some(UnaryOp::Abs) => format!("abs.{t} {y}, {x};"),
        Some(UnaryOp::Sqrt) => format!("sqrt.rn.{t} {y}, {x};"),
        Some(UnaryOp::Floor) if r.is_float() => format!("cvt.rmi.{t}.{t} {y}, {x};"),
        Some(UnaryOp::Ceil) if r.is_float() => format!("cvt.rpi.{t}.{t} {y}, {x};"),
        // Integers are their own floor and ceiling.
        Some(UnaryOp::Floor | UnaryOp::Ceil) => format!("mov.{t} {y}, {x};"),
        Some(op) => unreachable!("{op:?} is refused before a kernel is asked for"),
    };
    let _ = writeln!(s, "\t{instr}");
    address(&mut s, "%u9", "%u1", r);
    let _ = writeln!(s, "\tst.global.{t} [%u9], {y};");
    close_loop(&mut s);
    Kernel { name, ptx: s }
}

/// `out[i] = value` (an `f64` parameter converted to `t`). Parameters: `(out, value, n)`.
pub(crate) fn fill(t: DType) -> Kernel {
    let name = format!("fill_{}", ty(t));
    let mut s = String::new();
    open(&mut s, &name, &[".u64 out", ".f64 value", ".u64 n"]);
    load_params(&mut s, &["out"], "n");
    s.push_str("\tld.param.f64 %d6, [value];\n");
    let _ = writeln!(s, "\t{}", convert(t, &reg(t, 5), DType::F64, "%d6"));
    grid_stride_loop(&mut s);
    address(&mut s, "%u9", "%u0", t);
    let _ = writeln!(s, "\tst.global.{} [%u9], {};", ty(t), reg(t, 5));
    close_loop(&mut s);
    Kernel { name, ptx: s }
}

/// SplitMix64's increment and finaliser multipliers.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX1: u64 = 0xBF58_476D_1CE4_E5B9;
const MIX2: u64 = 0x94D0_49BB_1331_11EB;

/// Element `i` of a uniform [0, 1) block drawn with `seed`, as the device computes it:
/// SplitMix64 of `seed + (i + 1) * golden`, its top 53 bits (`f64`) or 24 bits (`f32`) scaled
/// into [0, 1). The host twin of [`random`], so answers can be checked bit for bit.
pub(crate) fn uniform(seed: u64, i: u64, t: DType) -> f64 {
    let mut z = seed.wrapping_add(i.wrapping_add(1).wrapping_mul(GOLDEN));
    z = (z ^ (z >> 30)).wrapping_mul(MIX1);
    z = (z ^ (z >> 27)).wrapping_mul(MIX2);
    z ^= z >> 31;
    if t == DType::F32 {
        f64::from(((z >> 40) as f32) * f32::from_bits(0x3380_0000))
    } else {
        (z >> 11) as f64 * f64::from_bits(0x3CA0_0000_0000_0000)
    }
}

/// `out[i] = uniform(seed, i)` ([`uniform`]) for a float type `t`. Parameters:
/// `(out, seed, n)`.
pub(crate) fn random(t: DType) -> Kernel {
    let name = format!("random_{}", ty(t));
    let mut s = String::new();
    open(&mut s, &name, &[".u64 out", ".u64 seed", ".u64 n"]);
    load_params(&mut s, &["out"], "n");
    s.push_str("\tld.param.u64 %u1, [seed];\n");
    grid_stride_loop(&mut s);
    let _ = write!(
        s,
        "\tadd.u64 %u10, %u4, 1;\n\tmul.lo.u64 %u10, %u10, {GOLDEN};\n\tadd.u64 %u10, %u10, %u1;\n\
         \tshr.u64 %u11, %u10, 30;\n\txor.b64 %u10, %u10, %u11;\n\tmul.lo.u64 %u10, %u10, {MIX1};\n\
         \tshr.u64 %u11, %u10, 27;\n\txor.b64 %u10, %u10, %u11;\n\tmul.lo.u64 %u10, %u10, {MIX2};\n\
         \tshr.u64 %u11, %u10, 31;\n\txor.b64 %u10, %u10, %u11;\n"
    );
    if t == DType::F32 {
        s.push_str(
            "\tshr.u64 %u11, %u10, 40;\n\tcvt.rn.f32.u64 %f5, %u11;\n\
             \tmul.rn.f32 %f5, %f5, 0f33800000;\n",
        );
    } else {
        s.push_str(
            "\tshr.u64 %u11, %u10, 11;\n\tcvt.rn.f64.u64 %d5, %u11;\n\
             \tmul.rn.f64 %d5, %d5, 0d3CA0000000000000;\n",
        );
    }
    address(&mut s, "%u9", "%u0", t);
    let _ = writeln!(s, "\tst.global.{} [%u9], {};", ty(t), reg(t, 5));
    close_loop(&mut s);
    Kernel { name, ptx: s }
}

/// A reduction device kernels compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Reduction {
    /// The sum (integers in `i64`, as NumPy's).
    Sum,
    /// The smallest element.
    Min,
    /// The largest element.
    Max,
}

impl Reduction {
    /// The type it accumulates (and returns) for elements of `t`.
    pub fn result(self, t: DType) -> DType {
        match self {
            Reduction::Sum => t.accumulated(),
            Reduction::Min | Reduction::Max => t,
        }
    }
}

/// `out[i] = reduce(a[j] for j = i, i + stride, ... < n)` for `i < stride`: one pass of a
/// tree reduction (the last pass has a stride of 1). Elements of `a` are converted to the
/// accumulator's type first. Parameters: `(a, out, stride, n)`.
pub(crate) fn reduce(op: Reduction, a: DType) -> Kernel {
    let r = op.result(a);
    let name = format!("reduce_{op:?}_{}", ty(a)).to_lowercase();
    let t = ty(r);
    let mut s = String::new();
    open(
        &mut s,
        &name,
        &[".u64 a", ".u64 out", ".u64 stride", ".u64 n"],
    );
    load_params(&mut s, &["a", "out"], "n");
    s.push_str("\tld.param.u64 %u12, [stride];\n");
    // This thread's element and the grid's stride; threads at or past `stride` do nothing.
    s.push_str(
        "\tmov.u32 %t0, %ctaid.x;\n\tmov.u32 %t1, %ntid.x;\n\tmov.u32 %t2, %tid.x;\n\
         \tmul.wide.u32 %u13, %t0, %t1;\n\tcvt.u64.u32 %u6, %t2;\n\tadd.u64 %u13, %u13, %u6;\n\
         \tsetp.ge.u64 %p0, %u13, %u12;\n\t@%p0 bra DONE;\n\tmov.u64 %u4, %u13;\n\
         \tmov.u64 %u5, %u12;\n",
    );
    let acc = reg(r, 5);
    let identity = match (op, r) {
        (Reduction::Sum, _) => format!("mov.{t} {acc}, {};", literal(r, 0.0)),
        (Reduction::Min, DType::F32 | DType::F64) => {
            format!("mov.{t} {acc}, {};", literal(r, f64::INFINITY))
        }
        (Reduction::Max, DType::F32 | DType::F64) => {
            format!("mov.{t} {acc}, {};", literal(r, f64::NEG_INFINITY))
        }
        (Reduction::Min, DType::I32) => format!("mov.{t} {acc}, {};", i32::MAX),
        (Reduction::Max, DType::I32) => format!("mov.{t} {acc}, {};", i32::MIN),
        (Reduction::Min, _) => format!("mov.{t} {acc}, {};", i64::MAX),
        // -2^63 has no decimal literal PTX takes: -(2^63 - 1) - 1.
        (Reduction::Max, _) => format!("mov.{t} {acc}, {};\n\tsub.{t} {acc}, {acc}, 1;", -i64::MAX),
    };
    let _ = writeln!(s, "\t{identity}");
    s.push_str("LOOP:\n\tsetp.ge.u64 %p0, %u4, %u3;\n\t@%p0 bra STORE;\n");
    address(&mut s, "%u7", "%u0", a);
    let _ = writeln!(s, "\tld.global.{} {}, [%u7];", ty(a), reg(a, 0));
    let _ = writeln!(s, "\t{}", convert(r, &reg(r, 1), a, &reg(a, 0)));
    let x = reg(r, 1);
    let _ = match op {
        Reduction::Sum => writeln!(s, "\tadd.{t} {acc}, {acc}, {x};"),
        // A NaN wins, as NumPy's (PTX's min and max would take the other operand): where
        // either is NaN, their sum (NaN) is kept.
        Reduction::Min | Reduction::Max if r.is_float() => writeln!(
            s,
            "\tsetp.nan.{t} %p1, {acc}, {x};\n\t@%p1 add.{t} {acc}, {acc}, {x};\n\t@!%p1 {}.{t} {acc}, {acc}, {x};",
            if op == Reduction::Min { "min" } else { "max" }
        ),
        Reduction::Min => writeln!(s, "\tmin.{t} {acc}, {acc}, {x};"),
        Reduction::Max => writeln!(s, "\tmax.{t} {acc}, {acc}, {x};"),
    };
    let _ = write!(
        s,
        "\tadd.u64 %u4, %u4, %u5;\n\tbra LOOP;\nSTORE:\n\tmul.lo.u64 %u9, %u13, {};\n\
         \tadd.u64 %u9, %u9, %u1;\n\tst.global.{t} [%u9], {acc};\nDONE:\n\tret;\n}}\n",
        r.size()
    );
    Kernel { name, ptx: s }
}

/// Every kernel the array's device operations can ask for, for checking them all (the
/// `ptxas` drill).
#[cfg(test)]
fn all() -> Vec<Kernel> {
    use BinaryOp::*;
    use UnaryOp::*;
    let mut out = Vec::new();
    for &a in &TYPES {
        for &b in &TYPES {
            for op in [Add, Sub, Mul, Div, Maximum, Minimum] {
                out.push(binary(op, a, b));
                out.push(scalar(op, a, b, false));
                out.push(scalar(op, a, b, true));
            }
            out.push(unary(None, a, b));
        }
        for op in [Neg, Abs, Sqrt, Floor, Ceil] {
            out.push(unary(Some(op), a, a));
        }
        for op in [Reduction::Sum, Reduction::Min, Reduction::Max] {
            out.push(reduce(op, a));
        }
        out.push(fill(a));
    }
    out.push(random(DType::F32));
    out.push(random(DType::F64));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_has_a_name_of_its_own() {
        let all = all();
        let mut names: Vec<&str> = all.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n, "two kernels share a name");
        for k in &all {
            assert!(
                k.ptx.contains(&format!(".visible .entry {}(", k.name)),
                "{}",
                k.name
            );
            // Every branch target it names is defined.
            for target in ["LOOP", "DONE"] {
                if k.ptx.contains(&format!("bra {target};")) {
                    assert!(k.ptx.contains(&format!("{target}:")), "{}", k.ptx);
                }
            }
        }
    }

    #[test]
    fn operands_are_converted_to_the_result_type_as_numpy_promotes() {
        let k = binary(BinaryOp::Add, DType::I32, DType::F32);
        // NumPy: int32 + float32 is float64.
        assert!(k.ptx.contains("cvt.rn.f64.s32 %d1, %i0;"), "{}", k.ptx);
        assert!(k.ptx.contains("cvt.f64.f32 %d3, %f2;"), "{}", k.ptx);
        assert!(k.ptx.contains("add.f64 %d4, %d1, %d3;"), "{}", k.ptx);
        assert!(k.ptx.contains("st.global.f64 [%u9], %d4;"), "{}", k.ptx);
        // Integer division is true division.
        let k = binary(BinaryOp::Div, DType::I64, DType::I64);
        assert!(k.ptx.contains("div.rn.f64"), "{}", k.ptx);
        // Casts to integers truncate.
        let k = unary(None, DType::F64, DType::I32);
        assert!(k.ptx.contains("cvt.rzi.s32.f64 %i1, %d0;"), "{}", k.ptx);
    }

    #[test]
    fn a_scalar_takes_its_side() {
        let k = scalar(BinaryOp::Sub, DType::F32, DType::F32, true);
        assert!(k.ptx.contains("sub.f32 %f4, %f3, %f1;"), "{}", k.ptx);
        let k = scalar(BinaryOp::Sub, DType::F32, DType::F32, false);
        assert!(k.ptx.contains("sub.f32 %f4, %f1, %f3;"), "{}", k.ptx);
    }

    #[test]
    fn reductions_start_from_their_identity() {
        assert!(
            reduce(Reduction::Sum, DType::I32)
                .ptx
                .contains("mov.s64 %l5, 0;")
        );
        assert!(
            reduce(Reduction::Min, DType::F64)
                .ptx
                .contains("mov.f64 %d5, 0d7FF0000000000000;")
        );
        assert!(
            reduce(Reduction::Max, DType::F32)
                .ptx
                .contains("mov.f32 %f5, 0fFF800000;")
        );
        assert!(
            reduce(Reduction::Max, DType::I64)
                .ptx
                .contains("mov.s64 %l5, -9223372036854775807;\n\tsub.s64 %l5, %l5, 1;")
        );
        // A NaN wins a float minimum or maximum, as NumPy's.
        assert!(reduce(Reduction::Min, DType::F32).ptx.contains(
            "setp.nan.f32 %p1, %f5, %f1;\n\t@%p1 add.f32 %f5, %f5, %f1;\n\t@!%p1 min.f32"
        ));
        assert!(!reduce(Reduction::Max, DType::I32).ptx.contains("setp.nan"));
    }

    #[test]
    fn uniform_draws_lie_in_the_unit_interval_and_differ() {
        for t in [DType::F32, DType::F64] {
            let v: Vec<f64> = (0..10_000).map(|i| uniform(7, i, t)).collect();
            assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
            let mean = v.iter().sum::<f64>() / v.len() as f64;
            assert!((mean - 0.5).abs() < 0.02, "{mean}");
            assert_ne!(uniform(7, 0, t), uniform(8, 0, t));
        }
        // The largest f32 draw stays below one.
        assert!(((u64::MAX >> 40) as f32) * f32::from_bits(0x3380_0000) < 1.0);
    }

    /// Every kernel assembles with NVIDIA's `ptxas` for a Hopper GPU (the GPU proof's), with
    /// no GPU needed: `PTXAS` names the assembler (scripts/setup_test_tools.sh fetches it).
    #[test]
    #[ignore = "drill: needs ptxas (PTXAS=path)"]
    fn ptxas_assembles_every_kernel() {
        let ptxas = std::env::var("PTXAS").expect("PTXAS: the path of NVIDIA's ptxas");
        let dir = std::env::temp_dir().join(format!("dask-ptx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernels = all();
        let mut failed = Vec::new();
        for k in &kernels {
            let src = dir.join(format!("{}.ptx", k.name));
            std::fs::write(&src, &k.ptx).unwrap();
            let out = std::process::Command::new(&ptxas)
                .args(["-arch=sm_90", "-o"])
                .arg(dir.join(format!("{}.cubin", k.name)))
                .arg(&src)
                .output()
                .expect("running ptxas");
            if !out.status.success() {
                failed.push(format!(
                    "{}: {}",
                    k.name,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            failed.is_empty(),
            "{} of {} kernels failed:\n{}\n(first kernel's text:\n{})",
            failed.len(),
            kernels.len(),
            failed.join("\n"),
            kernels
                .iter()
                .find(|k| failed[0].starts_with(&k.name))
                .map_or("", |k| k.ptx.as_str())
        );
        eprintln!("ptxas assembled {} kernels", kernels.len());
    }
}
