//! The one idea of noise the verdict uses: a measurement moved only when a
//! one-sided Mann–Whitney U test says so at [`ALPHA`] *and* the medians
//! differ by at least a stated share. Used for the revision against the base
//! and, with its own minimum share, for Rust against C.
//!
//! Mann–Whitney compares ranks, so it needs no assumption about the shape of
//! throughput samples (under TCG they are skewed by host stalls). With the
//! farm's five to six samples a side, the smallest p it can give is about
//! 0.002-0.004: a call at p < 0.01 needs a clear separation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Significance level of a one-sided call.
pub const ALPHA: f64 = 0.01;

/// A significant shift downwards.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shift {
    /// median(this) / median(reference).
    pub ratio: f64,
    /// One-sided p-value that `this` is stochastically smaller.
    pub p: f64,
}

pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The largest n1 × n2 whose p-value is counted exactly. Counting costs
/// about n1 × n2 × n1 × n2 steps (13 million at 60 × 60), once per pair of
/// sample sizes; from 20 × 20 on, the normal approximation is within 0.005
/// of the exact value.
const EXACT_MAX_PAIRS: usize = 400;

/// One-sided p-value of Mann–Whitney's U that `a` tends to be smaller than
/// `b`: exact without ties for small samples (n1 × n2 up to
/// [`EXACT_MAX_PAIRS`]), else the normal approximation with tie and
/// continuity corrections. None if either side is empty.
pub fn p_smaller(a: &[f64], b: &[f64]) -> Option<f64> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    // U counts pairs (x in a, y in b) with x > y (ties count a half): a small
    // U means `a` tends to be smaller.
    let mut u = 0.0;
    let mut ties = false;
    for x in a {
        for y in b {
            if x > y {
                u += 1.0;
            } else if x == y {
                u += 0.5;
                ties = true;
            }
        }
    }
    if !ties && n1 * n2 <= EXACT_MAX_PAIRS {
        return Some(exact_cdf(n1, n2, u as usize));
    }
    Some(normal_p(a, b, u))
}

/// P(U <= u) by the normal approximation, with the tie correction over the
/// pooled sample and the continuity correction.
fn normal_p(a: &[f64], b: &[f64], u: f64) -> f64 {
    let (n1f, n2f) = (a.len() as f64, b.len() as f64);
    let mean = n1f * n2f / 2.0;
    // Tie correction over the pooled sample.
    let mut pooled: Vec<f64> = a.iter().chain(b).copied().collect();
    pooled.sort_by(f64::total_cmp);
    let mut t = 0.0;
    let mut i = 0;
    while i < pooled.len() {
        let mut j = i;
        while j + 1 < pooled.len() && pooled[j + 1] == pooled[i] {
            j += 1;
        }
        let k = (j - i + 1) as f64;
        t += k * k * k - k;
        i = j + 1;
    }
    let n = n1f + n2f;
    let var = n1f * n2f / 12.0 * ((n + 1.0) - t / (n * (n - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = (u + 0.5 - mean) / var.sqrt();
    normal_cdf(z)
}

/// P(U <= u) for sample sizes n1, n2 without ties, from [`exact_distribution`]
/// (counted once per pair of sample sizes: a dashboard asks for the same
/// few sizes thousands of times).
fn exact_cdf(n1: usize, n2: usize, u: usize) -> f64 {
    type Tables = HashMap<(usize, usize), Arc<Vec<f64>>>;
    static TABLES: OnceLock<Mutex<Tables>> = OnceLock::new();
    let tables = TABLES.get_or_init(Default::default);
    let cdf = {
        let mut t = tables.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(
            t.entry((n1, n2))
                .or_insert_with(|| Arc::new(exact_distribution(n1, n2))),
        )
    };
    cdf[u.min(n1 * n2)]
}

/// P(U <= k) for k in 0..=n1 × n2, sample sizes n1, n2 without ties, by
/// counting the arrangements (the classic recurrence over the largest
/// element).
fn exact_distribution(n1: usize, n2: usize) -> Vec<f64> {
    let max = n1 * n2;
    // f[i][j][k]: arrangements of i a's and j b's with U = k.
    let mut prev: Vec<Vec<f64>> = vec![vec![0.0; max + 1]; n2 + 1];
    for row in prev.iter_mut() {
        row[0] = 1.0; // zero a's: U = 0, one arrangement
    }
    for _ in 1..=n1 {
        let mut cur: Vec<Vec<f64>> = vec![vec![0.0; max + 1]; n2 + 1];
        cur[0][0] = 1.0; // zero b's
        for j in 1..=n2 {
            for k in 0..=max {
                // The largest element is an a (beats all j b's) or a b.
                let from_a = if k >= j { prev[j][k - j] } else { 0.0 };
                cur[j][k] = from_a + cur[j - 1][k];
            }
        }
        prev = cur;
    }
    let counts = &prev[n2];
    let total: f64 = counts.iter().sum();
    let mut below = 0.0;
    counts
        .iter()
        .map(|c| {
            below += c;
            below / total
        })
        .collect()
}

fn normal_cdf(z: f64) -> f64 {
    0.5 * erfc(-z / std::f64::consts::SQRT_2)
}

/// Complementary error function (Numerical Recipes' erfcc, |error| < 1.2e-7).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// `this` is lower than `reference` by at least `min_effect` (a share of the
/// reference median) and significantly so (p < [`ALPHA`]).
pub fn lower(reference: &[f64], this: &[f64], min_effect: f64) -> Option<Shift> {
    let (mr, mt) = (median(reference), median(this));
    if !(mr.is_finite() && mt.is_finite()) || mr == 0.0 {
        return None;
    }
    let ratio = mt / mr;
    if ratio > 1.0 - min_effect {
        return None;
    }
    let p = p_smaller(this, reference)?;
    (p < ALPHA).then_some(Shift { ratio, p })
}

/// A significant difference either way: `b` lower or higher than `a`.
pub fn shift(a: &[f64], b: &[f64], min_effect: f64) -> Option<Shift> {
    lower(a, b, min_effect).or_else(|| {
        lower(b, a, min_effect).map(|s| Shift {
            ratio: 1.0 / s.ratio,
            p: s.p,
        })
    })
}

/// The share of `trials` in which a revision truly `effect` slower than
/// `base` would be called lower (by [`lower`] at `min_effect`), each trial
/// drawing `n` samples a side with replacement from the base's own samples
/// (the revision's scaled by 1 − effect): the power the measured noise
/// leaves for that loss. Deterministic: the draws are seeded by the samples.
/// The answer is kept per input (a dashboard asks for the same measurement
/// on several pages).
pub fn power(base: &[f64], n: usize, effect: f64, min_effect: f64, trials: usize) -> Option<f64> {
    if base.len() < 2 || n == 0 || trials == 0 {
        return None;
    }
    type Key = (Vec<u64>, usize, u64, u64, usize);
    static KEPT: OnceLock<Mutex<HashMap<Key, f64>>> = OnceLock::new();
    let key: Key = (
        base.iter().map(|x| x.to_bits()).collect(),
        n,
        effect.to_bits(),
        min_effect.to_bits(),
        trials,
    );
    let kept = KEPT.get_or_init(Default::default);
    if let Some(p) = kept.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Some(*p);
    }
    let p = simulated_power(base, n, effect, min_effect, trials);
    let mut k = kept.lock().unwrap_or_else(|e| e.into_inner());
    if k.len() >= 4096 {
        k.clear(); // a long-running dashboard keeps a bounded set
    }
    k.insert(key, p);
    Some(p)
}

fn simulated_power(base: &[f64], n: usize, effect: f64, min_effect: f64, trials: usize) -> f64 {
    let mut state = base.iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, x| {
        (h ^ x.to_bits()).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    let mut draw = || {
        // xorshift64*
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        let r = state.wrapping_mul(0x2545_f491_4f6c_dd1d);
        base[(r % base.len() as u64) as usize]
    };
    let mut hits = 0;
    for _ in 0..trials {
        let b: Vec<f64> = (0..n).map(|_| draw()).collect();
        let t: Vec<f64> = (0..n).map(|_| draw() * (1.0 - effect)).collect();
        if lower(&b, &t, min_effect).is_some() {
            hits += 1;
        }
    }
    hits as f64 / trials as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_grows_with_the_loss_and_the_samples_and_is_repeatable() {
        // A paced link's per-second samples: about 1.5 % apart.
        let base = [94.1, 92.6, 95.3, 93.8, 94.9, 93.2, 95.8, 94.4];
        let p5 = power(&base, 6, 0.05, 0.025, 400).unwrap();
        let p10 = power(&base, 6, 0.10, 0.025, 400).unwrap();
        let none = power(&base, 6, 0.0, 0.025, 400).unwrap();
        assert!(p10 >= p5 && p5 > none, "{none} {p5} {p10}");
        assert!(none <= 0.02, "false alarms base against base: {none}");
        assert_eq!(power(&base, 6, 0.05, 0.025, 400), Some(p5));
        assert_eq!(power(&base[..1], 6, 0.05, 0.025, 400), None);
    }

    #[test]
    fn exact_p_matches_the_tables() {
        // Complete separation, 5 vs 5: 1 / C(10, 5) = 1/252.
        let lo = [1.0, 2.0, 3.0, 4.0, 5.0];
        let hi = [6.0, 7.0, 8.0, 9.0, 10.0];
        let p = p_smaller(&lo, &hi).unwrap();
        assert!((p - 1.0 / 252.0).abs() < 1e-12, "{p}");
        // The other way round it is certain not to be smaller.
        assert!((p_smaller(&hi, &lo).unwrap() - 1.0).abs() < 1e-12);
        // U = 1 of 25: P(U <= 1) = 2/252.
        let a = [1.0, 2.0, 3.0, 4.0, 6.5];
        let b = [5.0, 7.0, 8.0, 9.0, 10.0];
        assert!((p_smaller(&a, &b).unwrap() - 2.0 / 252.0).abs() < 1e-12);
    }

    #[test]
    fn the_counted_tables_hold_for_every_u_and_both_orders_of_sizes() {
        // 3 vs 4 and 4 vs 3, each U against an enumeration of the
        // C(7, 3) = 35 ways to place the a's among the 7 ranks; asked
        // twice, so the second answer comes from the kept table.
        for (n1, n2) in [(3usize, 4usize), (4, 3)] {
            let mut at_most = vec![0usize; n1 * n2 + 1];
            for mask in 0u32..(1 << (n1 + n2)) {
                if mask.count_ones() as usize != n1 {
                    continue;
                }
                // U: pairs (a, b) with the a ranked above the b.
                let u: usize = (0..n1 + n2)
                    .filter(|r| mask & (1 << r) != 0)
                    .map(|r| (0..r).filter(|q| mask & (1 << q) == 0).count())
                    .sum();
                for c in at_most.iter_mut().skip(u) {
                    *c += 1;
                }
            }
            for _ in 0..2 {
                for (u, c) in at_most.iter().enumerate() {
                    let p = exact_cdf(n1, n2, u);
                    assert!((p - *c as f64 / 35.0).abs() < 1e-12, "{n1}x{n2} U={u}: {p}");
                }
            }
        }
    }

    #[test]
    fn past_the_exact_limit_the_approximation_stays_close_to_the_count() {
        // 20 x 20, the largest exact case: every U in steps of 20, from
        // complete separation to its reverse, exact count against the
        // normal approximation.
        let b: Vec<f64> = (0..20).map(|i| 100.0 + i as f64).collect();
        for shift in 0..=20 {
            // The last `shift` values of `a` sit above all of `b`.
            let a: Vec<f64> = (0..20)
                .map(|i| {
                    if i < 20 - shift {
                        i as f64
                    } else {
                        200.0 + i as f64
                    }
                })
                .collect();
            let exact = p_smaller(&a, &b).unwrap();
            let u = (shift * 20) as f64;
            let approx = normal_p(&a, &b, u);
            assert!((exact - approx).abs() < 0.005, "U={u}: {exact} vs {approx}");
        }
        // 21 x 20 is past the limit: the approximation answers (the count
        // would give 1/C(41,20) for complete separation).
        let a: Vec<f64> = (0..21).map(|i| i as f64).collect();
        let p = p_smaller(&a, &b).unwrap();
        assert_eq!(p, normal_p(&a, &b, 0.0));
        assert!(p < 1e-6, "{p}");
    }

    #[test]
    fn ties_use_the_normal_approximation() {
        let a = [1.0, 1.0, 2.0, 2.0, 3.0, 3.0];
        let b = [5.0, 5.0, 6.0, 6.0, 7.0, 7.0];
        let p = p_smaller(&a, &b).unwrap();
        assert!(p > 0.0 && p < 0.01, "{p}");
        assert!(p_smaller(&a, &a).unwrap() > 0.4);
    }

    #[test]
    fn a_thirty_percent_drop_is_a_regression_and_noise_is_not() {
        let base = [93.1, 93.8, 92.9, 93.5, 93.6];
        let slow = [65.2, 64.8, 66.0, 65.5, 65.1];
        let s = lower(&base, &slow, 0.10).unwrap();
        assert!((s.ratio - 0.698).abs() < 0.01 && s.p < ALPHA, "{s:?}");
        // 3 % lower and separated: below the minimum effect, no call.
        let a_bit = [90.5, 90.9, 90.1, 90.7, 90.3];
        assert!(lower(&base, &a_bit, 0.10).is_none());
        // Lower median but overlapping samples: not significant.
        let noisy = [60.0, 95.0, 62.0, 94.0, 61.0];
        assert!(lower(&base, &noisy, 0.10).is_none());
        // Too few samples can never reach p < 0.01.
        assert!(lower(&[93.0], &[10.0], 0.10).is_none());
        assert!(shift(&slow, &base, 0.10).unwrap().ratio > 1.4);
    }
}
