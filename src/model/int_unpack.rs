//! One integer weight unpacked from its checkpoint's layout ([`IntCheckpoint::unpack`], the
//! layouts of `super::int_weights`) into codes, zero points and scales alike for every format
//! ([`Unpacked`]): what the CPU dequantizes ([`Unpacked::values`]) and a GPU repacks
//! (`super::int4_linear`).

use super::ModelError;
use super::int_weights::{IntCheckpoint, IntLayout, ReadStored};

impl IntCheckpoint {
    /// Weight `name` (`[out, inp]`) unpacked to its codes, zero points and scales. `read_i32`
    /// and `read_f32` give a stored tensor's shape and values (`None`: absent). Shapes that do not
    /// fit are errors naming the tensor.
    pub fn unpack(
        &self,
        name: &str,
        (out, inp): (usize, usize),
        read_i32: ReadStored<'_, i32>,
        read_f32: ReadStored<'_, f32>,
    ) -> Result<Unpacked, ModelError> {
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        let need_i32 = |suffix: &str| {
            let n = format!("{stem}.{suffix}");
            read_i32(&n)?.ok_or(ModelError::MissingTensor(n))
        };
        let need_f32 = |suffix: &str| {
            let n = format!("{stem}.{suffix}");
            read_f32(&n)?.ok_or(ModelError::MissingTensor(n))
        };
        let groups = match self.group_size {
            Some(g) if inp % g == 0 => inp / g,
            Some(g) => {
                return Err(ModelError::Config(format!(
                    "{name}: {inp} input features are not whole groups of {g}"
                )));
            }
            None => 1,
        };
        let per = (32 / self.bits) as usize;
        let check = |what: &str, shape: &[usize], want: &[usize]| {
            if shape == want {
                Ok(())
            } else {
                Err(ModelError::Config(format!(
                    "{stem}.{what} has shape {shape:?}, expected {want:?} for a [{out}, {inp}] \
                     weight in {}",
                    self.describe()
                )))
            }
        };
        let mut u = Unpacked {
            out,
            inp,
            codes: vec![0; out * inp],
            zeros: vec![0; out * groups],
            scales: vec![0.0; out * groups],
            groups,
            group_of: None,
        };
        match self.layout {
            IntLayout::Awq => {
                let (qs, q) = need_i32("qweight")?;
                check("qweight", &qs, &[inp, out / 8])?;
                let (zs, z) = need_i32("qzeros")?;
                check("qzeros", &zs, &[groups, out / 8])?;
                let (ss, s) = need_f32("scales")?;
                check("scales", &ss, &[groups, out])?;
                // Column c of a pack of 8 sits in nibble AWQ_NIBBLE[c].
                const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
                let code = |words: &[i32], row: usize, c: usize| {
                    let word = words[row * (out / 8) + c / 8] as u32;
                    ((word >> (4 * AWQ_NIBBLE[c % 8])) & 0xF) as u8
                };
                for i in 0..inp {
                    for o in 0..out {
                        u.codes[o * inp + i] = code(&q, i, o);
                    }
                }
                for g in 0..groups {
                    for o in 0..out {
                        u.zeros[o * groups + g] = i32::from(code(&z, g, o));
                        u.scales[o * groups + g] = s[g * out + o];
                    }
                }
            }
            IntLayout::Gptq { zero_offset } => {
                let (qs, q) = need_i32("qweight")?;
                check("qweight", &qs, &[inp / per, out])?;
                let (zs, z) = need_i32("qzeros")?;
                check("qzeros", &zs, &[groups, out / per])?;
                let (ss, s) = need_f32("scales")?;
                check("scales", &ss, &[groups, out])?;
                if let Some((gs, g)) = read_i32(&format!("{stem}.g_idx"))? {
                    check("g_idx", &gs, &[inp])?;
                    if let Some(&bad) = g.iter().find(|&&x| x < 0 || x as usize >= groups) {
                        return Err(ModelError::Config(format!(
                            "{stem}.g_idx names group {bad} of {groups}"
                        )));
                    }
                    let g: Vec<usize> = g.into_iter().map(|x| x as usize).collect();
                    // (A g_idx in order is the plain grouping: kept as none.)
                    if g.iter().enumerate().any(|(i, &x)| x != i / (inp / groups)) {
                        u.group_of = Some(g);
                    }
                }
                let (bits, mask) = (self.bits, (1u32 << self.bits) - 1);
                for i in 0..inp {
                    let shift = bits * (i % per) as u32;
                    for o in 0..out {
                        u.codes[o * inp + i] =
                            ((q[(i / per) * out + o] as u32 >> shift) & mask) as u8;
                    }
                }
                for g in 0..groups {
                    for o in 0..out {
                        let zshift = bits * (o % per) as u32;
                        let zero = ((z[g * (out / per) + o / per] as u32 >> zshift) & mask) as i32;
                        u.zeros[o * groups + g] = zero + zero_offset;
                        u.scales[o * groups + g] = s[g * out + o];
                    }
                }
            }
            IntLayout::PackQuantized => {
                let (qs, q) = need_i32("weight_packed")?;
                let words = (inp * self.bits as usize).div_ceil(32);
                check("weight_packed", &qs, &[out, words])?;
                let (ss, s) = need_f32("weight_scale")?;
                let scale_shape = [out, groups];
                if ss != scale_shape && !(groups == 1 && ss == [out]) {
                    check("weight_scale", &ss, &scale_shape)?;
                }
                u.scales.copy_from_slice(&s);
                // Codes are stored plus 2^(bits-1): that offset is every zero point's part.
                let offset = 1i32 << (self.bits - 1);
                u.zeros.fill(offset);
                if !self.symmetric {
                    let (zs, z) = need_i32("weight_zero_point")?;
                    let zwords = (out * self.bits as usize).div_ceil(32);
                    check("weight_zero_point", &zs, &[zwords, groups])?;
                    // Packed along the output: column g of the packed rows.
                    let mut column = vec![0i32; zwords];
                    for g in 0..groups {
                        for (r, c) in column.iter_mut().enumerate() {
                            *c = z[r * groups + g];
                        }
                        for o in 0..out {
                            u.zeros[o * groups + g] += dense_code(&column, o, self.bits) - offset;
                        }
                    }
                }
                for o in 0..out {
                    let row = &q[o * words..(o + 1) * words];
                    for i in 0..inp {
                        u.codes[o * inp + i] = dense_code(row, i, self.bits) as u8;
                    }
                }
            }
        }
        Ok(u)
    }
}

/// One integer weight `[out, inp]` unpacked: element `(o, i)` is `(codes[o, i] - zeros[o, g]) *
/// scales[o, g]` for `g` its input feature's group.
#[derive(Clone, Debug)]
pub struct Unpacked {
    /// Output features (rows).
    pub out: usize,
    /// Input features (columns).
    pub inp: usize,
    /// `[out, inp]`, unsigned (below `2^bits`).
    pub codes: Vec<u8>,
    /// `[out, groups]`: what each code is less (GPTQ v1's stored-less-one and compressed-tensors'
    /// signed storage already undone).
    pub zeros: Vec<i32>,
    /// `[out, groups]`.
    pub scales: Vec<f32>,
    /// Groups a row.
    pub groups: usize,
    /// Each input feature's group when they are not in order (GPTQ `desc_act`); `None`: feature
    /// `i` is in group `i / (inp / groups)`.
    pub group_of: Option<Vec<usize>>,
}

impl Unpacked {
    /// The group of input feature `i`.
    pub fn group(&self, i: usize) -> usize {
        match &self.group_of {
            Some(g) => g[i],
            None => i / (self.inp / self.groups),
        }
    }

    /// The weight's values, `[out, inp]` row-major f32.
    pub fn values(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w.chunks_exact_mut(self.inp.max(1)).enumerate() {
            for (i, v) in row.iter_mut().enumerate() {
                let at = o * self.groups + self.group(i);
                let q = i32::from(self.codes[o * self.inp + i]) - self.zeros[at];
                *v = q as f32 * self.scales[at];
            }
        }
        w
    }
}

/// Code `i` of `words` packed densely at `bits` a code, low bits first (compressed-tensors).
fn dense_code(words: &[i32], i: usize, bits: u32) -> i32 {
    let bit = i * bits as usize;
    let (word, off) = (bit / 32, (bit % 32) as u32);
    let mut v = (words[word] as u32) >> off;
    if off + bits > 32 {
        v |= (words[word + 1] as u32) << (32 - off);
    }
    (v & ((1u32 << bits) - 1)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_codes_cross_word_boundaries() {
        // 3-bit codes 0..=7 repeated: code 10 spans bits 30..33, across the first two words.
        let codes: Vec<u32> = (0..32).map(|i| i % 8).collect();
        let mut words = vec![0u32; 3];
        for (i, &c) in codes.iter().enumerate() {
            let bit = i * 3;
            words[bit / 32] |= c << (bit % 32);
            if bit % 32 + 3 > 32 {
                words[bit / 32 + 1] |= c >> (32 - bit % 32);
            }
        }
        let words: Vec<i32> = words.into_iter().map(|w| w as i32).collect();
        for (i, &c) in codes.iter().enumerate() {
            assert_eq!(dense_code(&words, i, 3), c as i32, "code {i}");
        }
    }
}
