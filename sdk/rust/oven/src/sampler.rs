//! Samplers over the host's top-K next-token distribution, and the seeded PRNG they draw from.
//!
//! The host returns the K most probable tokens with their probabilities under the full softmax
//! (most probable first). A sampler asks for the K it needs ([`Sampler::top_k`]; 0 = the server's
//! default, 256 on the real server) and picks one token among them. Temperature reshapes the
//! probabilities as `p^(1/T)`, renormalised over the K returned: sampling is exact for
//! [`TopK`] and an approximation, truncated at K, for the others.

use oven_raw::futures::Distribution;

/// SplitMix64 (Steele, Lea and Flood 2014): small, fast, and good enough for sampling.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), 24 bits of resolution.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u32 << 24) as f32
    }
}

/// Picks the next token from a top-K distribution.
pub trait Sampler {
    /// How many of the most probable tokens to ask the host for; 0 = the server's default.
    fn top_k(&self) -> u32;
    /// One token of `dist` (never empty: the context checks before calling).
    fn sample(&mut self, dist: &Distribution) -> u32;
}

/// The most probable token.
#[derive(Clone, Copy, Debug, Default)]
pub struct Greedy;

impl Sampler for Greedy {
    fn top_k(&self) -> u32 {
        1
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        dist.token_ids[0]
    }
}

/// Draw index i with weight `probs[i]^(1/temperature)` among the first `n`; temperature 0 is greedy.
fn draw(probs: &[f32], n: usize, temperature: f32, rng: &mut Rng) -> usize {
    let n = n.max(1).min(probs.len());
    if temperature <= 0.0 || n == 1 {
        return 0;
    }
    let exponent = 1.0 / temperature;
    let weights: Vec<f32> = probs[..n].iter().map(|p| p.max(0.0).powf(exponent)).collect();
    let total: f32 = weights.iter().sum();
    if !(total.is_finite() && total > 0.0) {
        return 0; // every weight underflowed (very low temperature): the most probable one
    }
    let mut target = rng.next_f32() * total;
    for (i, w) in weights.iter().enumerate() {
        if target < *w {
            return i;
        }
        target -= w;
    }
    n - 1 // rounding left a sliver past the last weight
}

/// All K returned tokens, reweighted by temperature.
#[derive(Clone, Debug)]
pub struct Temperature {
    pub temperature: f32,
    pub rng: Rng,
}

impl Temperature {
    pub fn new(temperature: f32, seed: u64) -> Self {
        Temperature { temperature, rng: Rng::new(seed) }
    }
}

impl Sampler for Temperature {
    fn top_k(&self) -> u32 {
        0
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        dist.token_ids[draw(&dist.probs, dist.probs.len(), self.temperature, &mut self.rng)]
    }
}

/// The `k` most probable tokens, reweighted by temperature.
#[derive(Clone, Debug)]
pub struct TopK {
    pub k: u32,
    pub temperature: f32,
    pub rng: Rng,
}

impl TopK {
    pub fn new(k: u32, temperature: f32, seed: u64) -> Self {
        TopK { k: k.max(1), temperature, rng: Rng::new(seed) }
    }
}

impl Sampler for TopK {
    fn top_k(&self) -> u32 {
        self.k
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        dist.token_ids[draw(&dist.probs, self.k as usize, self.temperature, &mut self.rng)]
    }
}

/// Nucleus sampling: the fewest most probable tokens whose probability reaches `p`.
#[derive(Clone, Debug)]
pub struct TopP {
    pub p: f32,
    pub temperature: f32,
    pub rng: Rng,
}

impl TopP {
    pub fn new(p: f32, temperature: f32, seed: u64) -> Self {
        TopP { p, temperature, rng: Rng::new(seed) }
    }
}

impl Sampler for TopP {
    fn top_k(&self) -> u32 {
        0
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        let total: f32 = dist.probs.iter().sum();
        let mut mass = 0.0;
        let mut n = dist.probs.len();
        for (i, p) in dist.probs.iter().enumerate() {
            mass += p;
            if mass >= self.p * total {
                n = i + 1;
                break;
            }
        }
        dist.token_ids[draw(&dist.probs, n, self.temperature, &mut self.rng)]
    }
}

/// The tokens at least `min_p` times as probable as the most probable one.
#[derive(Clone, Debug)]
pub struct MinP {
    pub min_p: f32,
    pub temperature: f32,
    pub rng: Rng,
}

impl MinP {
    pub fn new(min_p: f32, temperature: f32, seed: u64) -> Self {
        MinP { min_p, temperature, rng: Rng::new(seed) }
    }
}

impl Sampler for MinP {
    fn top_k(&self) -> u32 {
        0
    }

    fn sample(&mut self, dist: &Distribution) -> u32 {
        let floor = dist.probs[0] * self.min_p;
        let n = dist.probs.iter().take_while(|p| **p >= floor).count();
        dist.token_ids[draw(&dist.probs, n, self.temperature, &mut self.rng)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dist(probs: &[f32]) -> Distribution {
        Distribution { token_ids: (100..100 + probs.len() as u32).collect(), probs: probs.to_vec() }
    }

    fn counts(sampler: &mut dyn Sampler, d: &Distribution, draws: usize) -> Vec<usize> {
        let mut counts = vec![0; d.token_ids.len()];
        for _ in 0..draws {
            counts[(sampler.sample(d) - 100) as usize] += 1;
        }
        counts
    }

    #[test]
    fn rng_is_seeded_and_uniform() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!((0..5).map(|_| a.next_u64()).collect::<Vec<_>>(), (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(8).next_u64(), Rng::new(7).next_u64());
        let mean = (0..10_000).map(|_| a.next_f32() as f64).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {}", mean);
        assert!((0..10_000).all(|_| (0.0..1.0).contains(&a.next_f32())));
    }

    #[test]
    fn greedy_takes_the_first() {
        assert_eq!(Greedy.sample(&dist(&[0.5, 0.3, 0.2])), 100);
        assert_eq!(Greedy.top_k(), 1);
    }

    #[test]
    fn temperature_one_follows_the_probabilities() {
        let d = dist(&[0.6, 0.3, 0.1]);
        let c = counts(&mut Temperature::new(1.0, 1), &d, 20_000);
        for (count, p) in c.iter().zip(&d.probs) {
            assert!((*count as f32 / 20_000.0 - p).abs() < 0.02, "{:?}", c);
        }
    }

    #[test]
    fn low_temperature_sharpens_and_zero_is_greedy() {
        let d = dist(&[0.5, 0.4, 0.1]);
        let c = counts(&mut Temperature::new(0.1, 2), &d, 2_000);
        assert!(c[0] > 1_500, "{:?}", c);
        assert_eq!(counts(&mut Temperature::new(0.0, 2), &d, 100), vec![100, 0, 0]);
    }

    #[test]
    fn top_k_top_p_and_min_p_cut_the_tail() {
        let d = dist(&[0.4, 0.3, 0.2, 0.1]);
        assert_eq!(counts(&mut TopK::new(2, 1.0, 3), &d, 2_000)[2..], [0, 0]);
        assert_eq!(TopK::new(2, 1.0, 3).top_k(), 2);
        let c = counts(&mut TopP::new(0.65, 1.0, 4), &d, 2_000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] == 0 && c[3] == 0, "{:?}", c);
        let c = counts(&mut MinP::new(0.5, 1.0, 5), &d, 2_000);
        assert!(c[0] > 0 && c[1] > 0 && c[2] > 0 && c[3] == 0, "{:?}", c);
    }

    #[test]
    fn same_seed_same_samples() {
        let d = dist(&[0.25, 0.25, 0.25, 0.25]);
        assert_eq!(counts(&mut TopP::new(0.9, 0.8, 9), &d, 50), counts(&mut TopP::new(0.9, 0.8, 9), &d, 50));
    }
}
