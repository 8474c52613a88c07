//! Algebraic connectivity λ₂ of a graph (SwarmLab's "connectivity"): the
//! second-smallest eigenvalue of its Laplacian `L = D − A`. It is 0 when
//! the graph is not connected and grows with how well connected it is
//! (a path of n nodes: 2(1 − cos(π/n)); n nodes all linked: n).
//!
//! Lanczos iteration on `L` restricted to the vectors orthogonal to the
//! all-ones vector (the eigenvector of λ₁ = 0), with full
//! reorthogonalisation, then the smallest eigenvalue of the tridiagonal
//! matrix by Sturm bisection. At most [`LANCZOS_STEPS`] steps, each one
//! pass over the links: exact for graphs of up to that many nodes, and an
//! upper estimate converging from above on larger ones (λ₂ is the
//! spectrum's low end, where Lanczos converges first). Serial, fixed order,
//! f64: a deterministic function of the links.

/// Most Lanczos steps (Krylov vectors kept: `n` f64 each).
pub const LANCZOS_STEPS: usize = 60;

/// Reusable buffers.
#[derive(Debug, Clone, Default)]
pub struct Lanczos {
    degree: Vec<f64>,
    basis: Vec<Vec<f64>>,
    w: Vec<f64>,
    alpha: Vec<f64>,
    beta: Vec<f64>,
}

/// `out = L · x` for the graph of `n` nodes with undirected `links`.
fn laplacian_times(degree: &[f64], links: &[(u32, u32)], x: &[f64], out: &mut [f64]) {
    for ((o, d), xi) in out.iter_mut().zip(degree).zip(x) {
        *o = d * xi;
    }
    for &(a, b) in links {
        let (a, b) = (a as usize, b as usize);
        out[a] -= x[b];
        out[b] -= x[a];
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Removes the mean (the all-ones component) and returns the norm left.
fn centre_and_norm(x: &mut [f64]) -> f64 {
    let mean = x.iter().sum::<f64>() / x.len() as f64;
    for v in x.iter_mut() {
        *v -= mean;
    }
    dot(x, x).sqrt()
}

/// How many eigenvalues of the symmetric tridiagonal matrix (diagonal
/// `alpha`, off-diagonal `beta`) are below `x` (Sturm sequence).
fn count_below(alpha: &[f64], beta: &[f64], x: f64) -> usize {
    let mut count = 0;
    let mut d = 1.0f64;
    for (i, &a) in alpha.iter().enumerate() {
        let b2 = if i == 0 {
            0.0
        } else {
            beta[i - 1] * beta[i - 1]
        };
        d = a - x - if i == 0 { 0.0 } else { b2 / d };
        if d == 0.0 {
            d = -f64::EPSILON;
        }
        if d < 0.0 {
            count += 1;
        }
    }
    count
}

impl Lanczos {
    /// λ₂ of the graph of `n` nodes joined by `links` (each pair once,
    /// `a != b`, both `< n`). 0 for fewer than two nodes. `between` is
    /// called before each step and each vector of its reorthogonalisation
    /// (where a caller may hold the work).
    pub fn algebraic_connectivity(
        &mut self,
        n: usize,
        links: &[(u32, u32)],
        mut between: impl FnMut(),
    ) -> f64 {
        if n < 2 {
            return 0.0;
        }
        self.degree.clear();
        self.degree.resize(n, 0.0);
        for &(a, b) in links {
            self.degree[a as usize] += 1.0;
            self.degree[b as usize] += 1.0;
        }
        let steps = LANCZOS_STEPS.min(n - 1);
        self.basis.resize_with(steps + 1, Vec::new);
        self.alpha.clear();
        self.beta.clear();
        // A fixed start with every frequency in it, off the all-ones vector.
        let q0 = &mut self.basis[0];
        q0.clear();
        q0.extend((0..n).map(|i| ((i as f64 + 1.0) * 0.618_033_988_749_894_9).fract() - 0.5));
        let norm = centre_and_norm(q0);
        if norm == 0.0 {
            return 0.0;
        }
        q0.iter_mut().for_each(|v| *v /= norm);
        self.w.resize(n, 0.0);
        for k in 0..steps {
            between();
            laplacian_times(&self.degree, links, &self.basis[k], &mut self.w);
            let a = dot(&self.basis[k], &self.w);
            self.alpha.push(a);
            // Against every earlier vector, twice (full reorthogonalisation).
            for _ in 0..2 {
                for q in &self.basis[..=k] {
                    between();
                    let c = dot(q, &self.w);
                    for (w, qi) in self.w.iter_mut().zip(q) {
                        *w -= c * qi;
                    }
                }
            }
            let b = centre_and_norm(&mut self.w);
            if k + 1 == steps || b <= 1e-12 * (1.0 + a.abs()) {
                break;
            }
            self.beta.push(b);
            let next = &mut self.basis[k + 1];
            next.clear();
            next.extend(self.w.iter().map(|w| w / b));
        }
        // The smallest eigenvalue of T: L is positive semi-definite.
        let bound = self
            .alpha
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let left = if i == 0 { 0.0 } else { self.beta[i - 1].abs() };
                let right = self.beta.get(i).map_or(0.0, |b| b.abs());
                a.abs() + left + right
            })
            .fold(0.0, f64::max);
        let (mut lo, mut hi) = (0.0f64, bound);
        let beta = &self.beta[..self.alpha.len() - 1];
        for _ in 0..200 {
            let mid = 0.5 * (lo + hi);
            if count_below(&self.alpha, beta, mid) >= 1 {
                hi = mid;
            } else {
                lo = mid;
            }
            if hi - lo <= 1e-12 * (1.0 + hi) {
                break;
            }
        }
        0.5 * (lo + hi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lambda2(n: usize, links: &[(u32, u32)]) -> f64 {
        Lanczos::default().algebraic_connectivity(n, links, || {})
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * (1.0 + b.abs())
    }

    #[test]
    fn known_graphs_by_formula() {
        use std::f64::consts::PI;
        for n in [2usize, 3, 10, 50] {
            let path: Vec<(u32, u32)> = (1..n as u32).map(|i| (i - 1, i)).collect();
            let want = 2.0 * (1.0 - (PI / n as f64).cos());
            assert!(
                close(lambda2(n, &path), want),
                "path {n}: {}",
                lambda2(n, &path)
            );
            let mut cycle = path.clone();
            if n > 2 {
                cycle.push((n as u32 - 1, 0));
                let want = 2.0 * (1.0 - (2.0 * PI / n as f64).cos());
                assert!(close(lambda2(n, &cycle), want), "cycle {n}");
            }
            let complete: Vec<(u32, u32)> = (0..n as u32)
                .flat_map(|a| (a + 1..n as u32).map(move |b| (a, b)))
                .collect();
            assert!(close(lambda2(n, &complete), n as f64), "complete {n}");
        }
        // A star of n nodes: 1.
        let star: Vec<(u32, u32)> = (1..30).map(|i| (0, i)).collect();
        assert!(close(lambda2(30, &star), 1.0));
    }

    #[test]
    fn disconnected_graphs_are_zero_and_larger_ones_are_estimated_from_above() {
        // Two separate edges.
        assert!(lambda2(4, &[(0, 1), (2, 3)]).abs() < 1e-9);
        // An isolated node.
        assert!(lambda2(3, &[(0, 1)]).abs() < 1e-9);
        assert_eq!(lambda2(1, &[]), 0.0);
        // A 20 x 20 grid graph (400 nodes, past the steps): λ₂ = 2(1 − cos(π/20)).
        let side = 20u32;
        let mut grid = Vec::new();
        for y in 0..side {
            for x in 0..side {
                let i = y * side + x;
                if x + 1 < side {
                    grid.push((i, i + 1));
                }
                if y + 1 < side {
                    grid.push((i, i + side));
                }
            }
        }
        let want = 2.0 * (1.0 - (std::f64::consts::PI / 20.0).cos());
        let got = lambda2(400, &grid);
        assert!(
            got >= want * (1.0 - 1e-9) && got <= want * 1.05,
            "{got} vs {want}"
        );
    }
}
