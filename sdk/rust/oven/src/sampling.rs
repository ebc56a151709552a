//! Samplers over the host's top-K next-token distribution, and the seeded generator they draw from.
//!
//! The host returns the K most probable tokens with their probabilities under the full softmax
//! (most probable first). A sampler asks for the K it needs ([`Sampler::top_k`]; 0 = the server's
//! default, 256 on the real server), keeps some of them and draws one with weight `p^(1/T)`.
//!
//! The algorithm is the Python SDK's (`sdk/python/inferlet/sampling.py`), operation for operation,
//! so that a seed gives the same tokens in both SDKs; `sdk/README.md` ("Seeded sampling")
//! specifies it, with test vectors. Every step is an exactly rounded IEEE-754 binary64 operation,
//! so the result does not depend on the platform's math library: `weight` computes `x^a` from
//! its own series rather than `powf`.

use std::f64::consts::{FRAC_1_SQRT_2 as SQRT_HALF, LN_2 as LN2};

use oven_raw::forward::SamplerKind;
use oven_raw::futures::Distribution;

/// 1 / (2k + 1), k = 10 down to 0: the series of atanh, which gives ln.
const LN_TERMS: [f64; 11] = [
    0.047619047619047616,
    0.05263157894736842,
    0.058823529411764705,
    0.06666666666666667,
    0.07692307692307693,
    0.09090909090909091,
    0.1111111111111111,
    0.14285714285714285,
    0.2,
    0.3333333333333333,
    1.0,
];
/// c_0 = 1, c_j = c_(j-1) / j, j = 14 down to 0: the Taylor series of exp.
const EXP_TERMS: [f64; 15] = [
    1.1470745597729726e-11,
    1.6059043836821616e-10,
    2.08767569878681e-09,
    2.505210838544172e-08,
    2.7557319223985894e-07,
    2.7557319223985893e-06,
    2.48015873015873e-05,
    0.0001984126984126984,
    0.001388888888888889,
    0.008333333333333333,
    0.041666666666666664,
    0.16666666666666666,
    0.5,
    1.0,
    1.0,
];

/// SplitMix64's increment: each draw adds it to the state.
pub(crate) const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64 (Steele, Lea and Flood 2014): a 64-bit state, seeded with `seed`.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The state: the seed plus the draws made so far times SplitMix64's increment (mod 2^64).
    pub fn state(&self) -> u64 {
        self.state
    }

    /// Move on as `draws` draws would, without making them (the generator is counter-based): for
    /// draws the server made in the sampler's place.
    pub fn skip(&mut self, draws: u64) {
        self.state = self.state.wrapping_add(GAMMA.wrapping_mul(draws));
    }

    /// Uniform in [0, 1): the top 53 bits of `next_u64` times 2^-53 (exact).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * 1.1102230246251565e-16
    }
}

/// Natural logarithm of a positive normal `x`, to about 1e-15.
fn ln(x: f64) -> f64 {
    // frexp: x = m * 2^e with 0.5 <= m < 1 (x is normal).
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i32 - 1022;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3fe0_0000_0000_0000);
    if m < SQRT_HALF {
        m *= 2.0;
        e -= 1;
    }
    let s = (m - 1.0) / (m + 1.0);
    let z = s * s;
    let poly = LN_TERMS.iter().fold(0.0, |poly, c| poly * z + c);
    e as f64 * LN2 + 2.0 * s * poly
}

/// e^y for y <= 0, to about 1e-15; 0 below -708 (where the result would leave the normal range).
fn exp(y: f64) -> f64 {
    if y < -708.0 {
        return 0.0;
    }
    let k = (y / LN2 + 0.5).floor();
    let r = y - k * LN2;
    let q = EXP_TERMS.iter().fold(0.0, |q, c| q * r + c);
    // Times 2^k, exactly: -1021 <= k <= 0 here, so 2^k and the product are normal.
    q * f64::from_bits(((k as i64 + 1023) as u64) << 52)
}

/// `x^a` for 0 <= x <= 1 and a >= 0, as every SDK computes it: exp(a * ln x).
fn weight(x: f64, a: f64) -> f64 {
    if x >= 1.0 {
        1.0
    } else if x < f64::MIN_POSITIVE {
        0.0
    } else {
        exp(a * ln(x))
    }
}

/// The index of one of the first `n` candidates, drawn with weight `(probs[i] / probs[0])^(1/T)`;
/// one `next_f64` per call, whatever the case; temperature 0 (or one candidate) is the most probable.
pub fn draw(probs: &[f32], n: usize, temperature: f64, rng: &mut Rng) -> usize {
    let u = rng.next_f64();
    let n = n.max(1).min(probs.len());
    let top = probs[0] as f64;
    if n == 1 || temperature == 0.0 || top.is_nan() || top <= 0.0 {
        return 0;
    }
    let a = 1.0 / temperature;
    let weights: Vec<f64> = probs[..n]
        .iter()
        .map(|p| if temperature == 1.0 { *p as f64 / top } else { weight(*p as f64 / top, a) })
        .collect();
    let total = weights.iter().fold(0.0, |sum, w| sum + w); // left to right, each sum rounded
    let target = u * total;
    let mut cumulative = 0.0;
    for (i, w) in weights.iter().enumerate() {
        cumulative += w;
        if target < cumulative {
            return i;
        }
    }
    n - 1
}

/// Picks the next token from a top-K distribution.
pub trait Sampler {
    /// How many of the most probable tokens to ask the host for; 0 = the server's default.
    fn top_k(&self) -> u32;
    /// One token of `dist` (never empty: the context checks before calling).
    fn sample(&mut self, dist: &Distribution) -> u32;
    /// How the server can run this sampler in the inferlet's place with the same draws (WIT
    /// `forward-sample`, which `Context::generate` pipelines), or None, the default: a sampler of
    /// your own is run by the inferlet.
    fn server_spec(&mut self) -> Option<ServerSpec<'_>> {
        None
    }
}

/// A built-in sampler as the server runs it: its kind, temperature and parameter (TopK's k, TopP's
/// or MinP's p), and its generator (None for Greedy, which draws nothing).
pub struct ServerSpec<'a> {
    pub kind: SamplerKind,
    pub temperature: f64,
    pub param: f64,
    pub rng: Option<&'a mut Rng>,
}

/// The most probable token (draws nothing).
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Sampler for Greedy {
    fn top_k(&self) -> u32 {
        1
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        dist.token_ids[0]
    }

    fn server_spec(&mut self) -> Option<ServerSpec<'_>> {
        Some(ServerSpec { kind: SamplerKind::Greedy, temperature: 0.0, param: 0.0, rng: None })
    }
}

fn check_temperature(temperature: f64) {
    assert!(temperature >= 0.0, "temperature must be >= 0 (0 samples greedily)");
}

/// Every candidate returned, with weight `p^(1/temperature)`; temperature 0 is greedy.
#[derive(Clone, Debug)]
pub struct Temperature {
    pub temperature: f64,
    pub rng: Rng,
}

impl Temperature {
    /// Panics if `temperature` is negative or NaN.
    pub fn new(temperature: f64, seed: u64) -> Self {
        check_temperature(temperature);
        Temperature { temperature, rng: Rng::new(seed) }
    }

    /// How many of the (sorted) candidates survive truncation: all.
    pub fn keep(&self, probs: &[f32]) -> usize {
        probs.len()
    }
}

/// The `k` most probable tokens (the host is asked for exactly `k`).
#[derive(Clone, Debug)]
pub struct TopK {
    pub k: u32,
    pub temperature: f64,
    pub rng: Rng,
}

impl TopK {
    /// Panics if `k` is 0 or `temperature` negative or NaN.
    pub fn new(k: u32, temperature: f64, seed: u64) -> Self {
        assert!(k >= 1, "k must be at least 1");
        check_temperature(temperature);
        TopK { k, temperature, rng: Rng::new(seed) }
    }

    pub fn keep(&self, probs: &[f32]) -> usize {
        (self.k as usize).min(probs.len())
    }
}

/// Nucleus sampling: the fewest most probable tokens whose probabilities (summed in order, as the
/// full softmax gave them) reach `p`; all of them if they never do.
#[derive(Clone, Debug)]
pub struct TopP {
    pub p: f64,
    pub temperature: f64,
    pub rng: Rng,
}

impl TopP {
    /// Panics unless 0 < `p` <= 1, or if `temperature` is negative or NaN.
    pub fn new(p: f64, temperature: f64, seed: u64) -> Self {
        assert!(p > 0.0 && p <= 1.0, "p must be in (0, 1]");
        check_temperature(temperature);
        TopP { p, temperature, rng: Rng::new(seed) }
    }

    pub fn keep(&self, probs: &[f32]) -> usize {
        let mut total = 0.0;
        for (i, prob) in probs.iter().enumerate() {
            total += *prob as f64;
            if total >= self.p {
                return i + 1;
            }
        }
        probs.len()
    }
}

/// The tokens at least `p` times as probable as the most probable one.
#[derive(Clone, Debug)]
pub struct MinP {
    pub p: f64,
    pub temperature: f64,
    pub rng: Rng,
}

impl MinP {
    /// Panics unless 0 <= `p` <= 1, or if `temperature` is negative or NaN.
    pub fn new(p: f64, temperature: f64, seed: u64) -> Self {
        assert!((0.0..=1.0).contains(&p), "p must be in [0, 1]");
        check_temperature(temperature);
        MinP { p, temperature, rng: Rng::new(seed) }
    }

    pub fn keep(&self, probs: &[f32]) -> usize {
        let floor = self.p * probs[0] as f64;
        probs.iter().take_while(|p| **p as f64 >= floor).count()
    }
}

/// `Sampler` for a sampler with `keep`, `temperature` and `rng`: ask the host for `$top_k`
/// candidates, keep some, draw among them.
macro_rules! truncating_sampler {
    ($name:ident, $top_k:expr, $kind:expr, $param:expr) => {
        impl Sampler for $name {
            fn top_k(&self) -> u32 {
                $top_k(self)
            }

            fn sample(&mut self, dist: &Distribution) -> u32 {
                dist.token_ids[draw(&dist.probs, self.keep(&dist.probs), self.temperature, &mut self.rng)]
            }

            fn server_spec(&mut self) -> Option<ServerSpec<'_>> {
                let param = $param(&*self);
                Some(ServerSpec { kind: $kind, temperature: self.temperature, param, rng: Some(&mut self.rng) })
            }
        }
    };
}

truncating_sampler!(Temperature, |_| 0, SamplerKind::Temperature, |_: &Temperature| 0.0);
truncating_sampler!(TopK, |s: &TopK| s.k, SamplerKind::TopK, |s: &TopK| s.k as f64);
truncating_sampler!(TopP, |_| 0, SamplerKind::TopP, |s: &TopP| s.p);
truncating_sampler!(MinP, |_| 0, SamplerKind::MinP, |s: &MinP| s.p);

#[cfg(test)]
mod tests {
    //! The test vectors of `sdk/README.md` ("Seeded sampling"); the Python SDK's tests check the same.
    use super::*;

    /// 0.4, 0.3, 0.15, 0.1, 0.05 as f32, the probabilities the vectors draw from.
    fn dist() -> Distribution {
        Distribution { token_ids: (0..5).collect(), probs: vec![0.4, 0.3, 0.15, 0.1, 0.05] }
    }

    fn draws(sampler: &mut dyn Sampler) -> String {
        let d = dist();
        (0..20).map(|_| sampler.sample(&d).to_string()).collect()
    }

    #[test]
    fn rng_vectors() {
        let mut rng = Rng::new(1234567);
        assert_eq!([rng.next_u64(), rng.next_u64(), rng.next_u64()], [6457827717110365317, 3203168211198807973, 9817491932198370423]);
        let mut rng = Rng::new(0);
        assert_eq!([rng.next_u64(), rng.next_u64(), rng.next_u64()], [16294208416658607535, 7960286522194355700, 487617019471545679]);
        let mut rng = Rng::new(42);
        assert_eq!([rng.next_f64(), rng.next_f64(), rng.next_f64()], [0.7415648787718233, 0.1599103928769201, 0.27860113025513866]);
    }

    #[test]
    fn skipping_draws_is_drawing_them() {
        let (mut drawn, mut skipped) = (Rng::new(2u64.pow(63) + 5), Rng::new(2u64.pow(63) + 5));
        for _ in 0..7 {
            drawn.next_u64();
        }
        skipped.skip(7);
        assert_eq!(drawn.state(), skipped.state());
    }

    #[test]
    fn the_built_in_samplers_tell_the_server_how_to_run_them() {
        let mut top_p = TopP::new(0.9, 0.7, 3);
        top_p.sample(&dist());
        let spec = top_p.server_spec().expect("a built-in sampler");
        assert_eq!((spec.kind, spec.temperature, spec.param), (SamplerKind::TopP, 0.7, 0.9));
        assert_eq!(spec.rng.map(|rng| rng.state()), Some(3u64.wrapping_add(GAMMA)));
        let mut top_k = TopK::new(5, 1.0, 0);
        let spec = top_k.server_spec().expect("a built-in sampler");
        assert_eq!((spec.kind, spec.param), (SamplerKind::TopK, 5.0));
        assert!(Greedy.server_spec().expect("a built-in sampler").rng.is_none());
    }

    #[test]
    fn weight_vectors() {
        assert_eq!(weight(0.5, 1.0 / 0.7).to_bits(), 0x3fd7c6a1f29e2ce6);
        assert_eq!(weight(0.1, 2.0).to_bits(), 0x3f847ae147ae147c);
        assert_eq!(weight(0.999, 10.0).to_bits(), 0x3fefae7299c256e3);
        assert_eq!(weight(1e-30, 0.5).to_bits(), 0x3cd203af9ee75620);
        assert_eq!((weight(1.0, 3.0), weight(0.0, 3.0), weight(0.5, 0.0)), (1.0, 0.0, 1.0));
        assert_eq!(weight(1e-300, 10.0), 0.0); // below e^-708
    }

    #[test]
    fn draw_vectors() {
        assert_eq!(draws(&mut Temperature::new(1.0, 7)), "00311010010433313012");
        assert_eq!(draws(&mut Temperature::new(0.7, 7)), "00210000000332212011");
        assert_eq!(draws(&mut TopK::new(3, 1.5, 7)), "00211010000222212011");
        assert_eq!(draws(&mut TopP::new(0.8, 0.7, 7)), "00210000000222112011");
        assert_eq!(draws(&mut MinP::new(0.3, 1.0, 7)), "00210000000222212011");
        assert_eq!(draws(&mut Temperature::new(0.0, 7)), "00000000000000000000");
        assert_eq!(draws(&mut Greedy), "00000000000000000000");
    }

    #[test]
    fn truncation_keeps_the_right_candidates() {
        let probs = dist().probs;
        assert_eq!(TopK::new(2, 1.0, 0).keep(&probs), 2);
        assert_eq!(TopK::new(9, 1.0, 0).keep(&probs), 5);
        assert_eq!(TopP::new(0.7, 1.0, 0).keep(&probs), 2); // 0.4 + 0.3 (as f32s) reaches 0.7
        assert_eq!(TopP::new(0.71, 1.0, 0).keep(&probs), 3);
        assert_eq!(MinP::new(0.5, 1.0, 0).keep(&probs), 2); // >= 0.2
        assert_eq!(MinP::new(0.375, 1.0, 0).keep(&probs), 3); // 0.15 (as an f32) >= 0.375 * 0.4 (as an f32)
        assert_eq!(MinP::new(0.0, 1.0, 0).keep(&probs), 5);
    }

    #[test]
    fn temperature_one_follows_the_probabilities() {
        let d = dist();
        let mut sampler = Temperature::new(1.0, 1);
        let mut counts = [0usize; 5];
        for _ in 0..20_000 {
            counts[sampler.sample(&d) as usize] += 1;
        }
        for (count, p) in counts.iter().zip(&d.probs) {
            assert!((*count as f32 / 20_000.0 - p).abs() < 0.02, "{:?}", counts);
        }
    }

    #[test]
    #[should_panic(expected = "temperature must be >= 0")]
    fn a_negative_temperature_panics() {
        Temperature::new(-1.0, 0);
    }
}
