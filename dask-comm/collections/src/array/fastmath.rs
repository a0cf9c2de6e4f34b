//! Sine and cosine of whole `f64` blocks in loops the compiler vectorises (libm's are one call
//! per element): the argument reduced by π/2 in three parts (Cody and Waite), then minimax
//! polynomials on [-π/4, π/4] (the coefficients of fdlibm's kernels, about 1 ulp), the
//! quadrant picked without branches. Arguments beyond ±10⁵, infinities and NaNs go to libm.
//! On x86-64 with AVX2 and FMA (checked at run time) the loop is compiled for them.

use std::f64::consts::FRAC_2_PI;

/// π/2 in three parts: the first 33 bits, the next 33, the rest (k · PIO2_1 is exact for
/// |k| < 2²⁰).
const PIO2_1: f64 = 1.570_796_326_734_125_6;
const PIO2_2: f64 = 6.077_100_506_303_966e-11;
const PIO2_3: f64 = 2.022_266_248_711_166_5e-21;

/// Past this the reduction above loses digits: libm takes over.
const LIMIT: f64 = 1.0e5;

const S: [f64; 6] = [
    -1.666_666_666_666_663_2e-1,
    8.333_333_333_322_49e-3,
    -1.984_126_982_985_795e-4,
    2.755_731_370_707_006_8e-6,
    -2.505_076_025_340_686_3e-8,
    1.589_690_995_211_55e-10,
];
const C: [f64; 6] = [
    4.166_666_666_666_66e-2,
    -1.388_888_888_887_411e-3,
    2.480_158_728_947_673e-5,
    -2.755_731_435_139_066_3e-7,
    2.087_572_321_298_175e-9,
    -1.135_964_755_778_819_5e-11,
];

/// sin(x) (`COS`: cos(x)) for |x| ≤ [`LIMIT`].
#[inline(always)]
fn kernel<const COS: bool>(x: f64) -> f64 {
    let k = (x * FRAC_2_PI).round_ties_even();
    let r = ((x - k * PIO2_1) - k * PIO2_2) - k * PIO2_3;
    let z = r * r;
    let s = r + r * z * (S[0] + z * (S[1] + z * (S[2] + z * (S[3] + z * (S[4] + z * S[5])))));
    let c = 1.0 - 0.5 * z
        + z * z * (C[0] + z * (C[1] + z * (C[2] + z * (C[3] + z * (C[4] + z * C[5])))));
    // The quadrant, 0..=3, as a float (cos is sin a quadrant on).
    let q = k + if COS { 1.0 } else { 0.0 };
    let q = q - 4.0 * (q * 0.25).floor();
    let v = if q == 0.0 || q == 2.0 { s } else { c };
    if q >= 2.0 { -v } else { v }
}

fn each<const COS: bool>(src: &[f64], dst: &mut [f64]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = kernel::<COS>(x);
    }
}

/// [`each`] compiled for AVX2 and FMA.
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn each_avx2<const COS: bool>(src: &[f64], dst: &mut [f64]) {
    each::<COS>(src, dst)
}

/// `dst[i] = sin(src[i])` (`COS`: cosine); the slices are as long as each other.
pub(crate) fn sin_cos<const COS: bool>(src: &[f64], dst: &mut [f64]) {
    assert_eq!(src.len(), dst.len(), "source and destination lengths");
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU was just found to have AVX2 and FMA, all `each_avx2` needs.
            unsafe { each_avx2::<COS>(src, dst) };
        } else {
            each::<COS>(src, dst);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    each::<COS>(src, dst);
    for (d, &x) in dst.iter_mut().zip(src) {
        // Large, infinite or NaN arguments.
        if x.is_nan() || x.abs() > LIMIT {
            *d = if COS { x.cos() } else { x.sin() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_libm_to_an_ulp_or_two_and_hands_over_past_the_limit() {
        let mut xs: Vec<f64> = (-200_000..200_000).map(|i| i as f64 * 0.37).collect();
        xs.extend([
            0.0,
            -0.0,
            1e-300,
            std::f64::consts::FRAC_PI_2,
            std::f64::consts::PI,
            99_999.9,
            1e6,
            -3e15,
            f64::INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
        ]);
        let mut out = vec![0.0; xs.len()];
        for cos in [false, true] {
            if cos {
                sin_cos::<true>(&xs, &mut out);
            } else {
                sin_cos::<false>(&xs, &mut out);
            }
            for (&x, &got) in xs.iter().zip(&out) {
                let want = if cos { x.cos() } else { x.sin() };
                let ok = (got - want).abs() <= 4.0 * f64::EPSILON * want.abs().max(1e-300)
                    || (got - want).abs() <= 2e-16
                    || (got.is_nan() && want.is_nan());
                assert!(ok, "cos={cos} x={x}: {got} vs libm {want}");
            }
        }
    }
}
