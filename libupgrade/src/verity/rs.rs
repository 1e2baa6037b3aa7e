//! Reed-Solomon RS(255, 255-roots) over GF(2^8) with the parameters dm-verity's FEC uses
//! (field polynomial 0x11d, first consecutive root 0, primitive element 1): systematic
//! encoding and decoding of erasures (positions known from the hash tree).

/// Field size minus one: symbols per codeword.
const NN: usize = 255;

/// Log and antilog tables and the generator polynomial for one number of roots.
pub(super) struct Codec {
    alpha_to: [u8; 256],
    index_of: [u16; 256],
    /// Generator polynomial in index form, `roots + 1` coefficients.
    genpoly: Vec<u16>,
    roots: usize,
}

/// `index_of` value of 0 (log of zero is undefined).
const A0: u16 = NN as u16;

fn modnn(x: usize) -> usize {
    x % NN
}

impl Codec {
    /// The codec with `roots` parity symbols (2..=24).
    pub fn new(roots: usize) -> Codec {
        let mut alpha_to = [0u8; 256];
        let mut index_of = [0u16; 256];
        let mut sr: u16 = 1;
        for (i, a) in alpha_to.iter_mut().take(NN).enumerate() {
            *a = sr as u8;
            index_of[sr as usize] = i as u16;
            sr <<= 1;
            if sr & 0x100 != 0 {
                sr ^= 0x11d;
            }
        }
        index_of[0] = A0;
        let mut c = Codec {
            alpha_to,
            index_of,
            genpoly: vec![0; roots + 1],
            roots,
        };
        // g(x) = (x - α^0)(x - α^1)…(x - α^(roots-1)), built in polynomial form.
        let mut g = vec![0u8; roots + 1];
        g[0] = 1;
        for root in 0..roots {
            g[root + 1] = 1;
            for j in (1..=root).rev() {
                g[j] = if g[j] != 0 {
                    g[j - 1] ^ c.alpha_to[modnn(c.index_of[g[j] as usize] as usize + root)]
                } else {
                    g[j - 1]
                };
            }
            g[0] = c.alpha_to[modnn(c.index_of[g[0] as usize] as usize + root)];
        }
        c.genpoly = g.iter().map(|v| c.index_of[*v as usize]).collect();
        c
    }

    fn mul(&self, a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            return 0;
        }
        let s = self.index_of[a as usize] as usize + self.index_of[b as usize] as usize;
        self.alpha_to[modnn(s)]
    }

    fn inv(&self, a: u8) -> u8 {
        self.alpha_to[modnn(NN - self.index_of[a as usize] as usize)]
    }

    /// α^e.
    fn pow(&self, e: usize) -> u8 {
        self.alpha_to[modnn(e)]
    }

    /// Feed the next data byte `d` of a codeword into its parity register `par` (all zero
    /// before the first byte; the parity once the last one is fed).
    pub fn feed(&self, par: &mut [u8], d: u8) {
        let nroots = self.roots;
        let fb = self.index_of[(d ^ par[0]) as usize];
        if fb != A0 {
            for (j, p) in par.iter_mut().enumerate().skip(1) {
                *p ^= self.alpha_to[modnn(fb as usize + self.genpoly[nroots - j] as usize)];
            }
        }
        par.copy_within(1.., 0);
        par[nroots - 1] = if fb != A0 {
            self.alpha_to[modnn(fb as usize + self.genpoly[0] as usize)]
        } else {
            0
        };
    }

    /// Syndromes `S_i = c(α^i)` of a whole codeword (data then parity, 255 bytes).
    fn syndromes(&self, cw: &[u8]) -> Vec<u8> {
        (0..self.roots)
            .map(|i| cw.iter().fold(0u8, |acc, b| self.mul(acc, self.pow(i)) ^ b))
            .collect()
    }

    /// Correct codeword `cw` (255 bytes: data then parity): first as erasures at the
    /// positions `erased` (blocks the tree found damaged), else as one error at an unknown
    /// position (a block the tree could not judge, or a byte of a block not known damaged).
    /// Returns false when neither decodes with every syndrome vanishing: `cw` is unchanged.
    pub fn correct(&self, cw: &mut [u8], erased: &[usize]) -> bool {
        let s = self.syndromes(cw);
        s.iter().all(|v| *v == 0)
            || self.correct_erasures(cw, &s, erased)
            || self.correct_one_error(cw, &s)
    }

    /// One error of value Y at locator X: S_i = Y·X^i, so X = S_1/S_0 and Y = S_0; every
    /// other syndrome must agree.
    fn correct_one_error(&self, cw: &mut [u8], s: &[u8]) -> bool {
        if s[0] == 0 || s[1] == 0 {
            return false;
        }
        let x = self.mul(s[1], self.inv(s[0]));
        let log_x = self.index_of[x as usize] as usize;
        let k = NN - 1 - log_x;
        let agrees = (0..self.roots).all(|i| s[i] == self.mul(s[0], self.pow(log_x * i)));
        if !agrees || k >= cw.len() {
            return false;
        }
        cw[k] ^= s[0];
        true
    }

    /// Correct the bytes of `cw` at the erased positions `erased` (at most `roots`, distinct)
    /// from its syndromes `s`.
    fn correct_erasures(&self, cw: &mut [u8], s: &[u8], erased: &[usize]) -> bool {
        let n = erased.len();
        if n == 0 || n > self.roots {
            return false;
        }
        // Position k holds the coefficient of x^(254-k): its locator is X = α^(254-k), and
        // S_i = Σ Y_e X_e^i. Solve the first n equations (Vandermonde) for the values Y.
        let x: Vec<u8> = erased.iter().map(|k| self.pow(NN - 1 - k)).collect();
        let mut a: Vec<Vec<u8>> = (0..n)
            .map(|i| {
                let mut row: Vec<u8> = x
                    .iter()
                    .map(|xe| self.pow(self.index_of[*xe as usize] as usize * i))
                    .collect();
                row.push(s[i]);
                row
            })
            .collect();
        if !self.eliminate(&mut a) {
            return false;
        }
        let mut fixed = cw.to_vec();
        for (e, k) in erased.iter().enumerate() {
            fixed[*k] ^= a[e][n];
        }
        // The remaining syndromes must vanish too, else the damage was not only there.
        if self.syndromes(&fixed).iter().any(|v| *v != 0) {
            return false;
        }
        cw.copy_from_slice(&fixed);
        true
    }

    /// Gauss-Jordan elimination of the augmented `n × (n+1)` system in place.
    fn eliminate(&self, a: &mut [Vec<u8>]) -> bool {
        let n = a.len();
        for col in 0..n {
            let Some(p) = (col..n).find(|r| a[*r][col] != 0) else {
                return false;
            };
            a.swap(col, p);
            let inv = self.inv(a[col][col]);
            for v in a[col].iter_mut() {
                *v = self.mul(*v, inv);
            }
            for r in 0..n {
                if r != col && a[r][col] != 0 {
                    let f = a[r][col];
                    let pivot = a[col].clone();
                    for (v, pv) in a[r].iter_mut().zip(pivot) {
                        *v ^= self.mul(f, pv);
                    }
                }
            }
        }
        true
    }
}
