//! The orders 4-bit codes are packed in for the GPU kernels ([`CodeOrder`]; see
//! `pagewise_kernels::Int4Layout` for the kernels' side): row by row, as the qkv GEMV with rotary
//! reads them, or in tiles of 16 x 64 for the tensor-core GEMV. In both, a little-endian 32-bit
//! word holds 8 codes as 4 pairs of neighbouring columns, pair `i` in nibbles `i` (the lower
//! column) and `4 + i`.

/// The order of a 4-bit weight's packed codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeOrder {
    /// Word `j` of a row holds columns `8j..8j + 8`, pair `i` being columns `8j + 2i` and
    /// `8j + 2i + 1` (AutoAWQ's order).
    Rows,
    /// Tiles of 16 rows x 64 columns, 512 bytes each, row tiles in order and each one's column
    /// tiles in order. Lane `l`'s 16 bytes of a tile start at `16 l`; its word `m` covers the
    /// tile's columns `16m..16m + 16`, its pairs `p = 0..3` starting at row `g + 8 (p % 2)` and
    /// column `2t + 8 (p / 2)` for `g = l / 4`, `t = l % 4`: lane `l`'s share of the A operand of
    /// an m16n8k16 tensor-core product.
    Tiles,
}

impl CodeOrder {
    /// Tiles when a `[out, k]` weight in groups of `group` columns fits them (`out` a multiple of
    /// 16, `k` of 64, groups whole rows or a power of two of at least 64 columns), else rows.
    pub fn best_for((out, k): (usize, usize), group: usize) -> CodeOrder {
        let fits = out.is_multiple_of(16)
            && k.is_multiple_of(64)
            && k > 0
            && (group >= k || (group >= 64 && group.is_power_of_two()));
        if fits {
            CodeOrder::Tiles
        } else {
            CodeOrder::Rows
        }
    }

    /// Where code `(row, col)` of a `[.., k]` weight is: its 32-bit word and nibble.
    fn place(self, k: usize, row: usize, col: usize) -> (usize, usize) {
        match self {
            CodeOrder::Rows => {
                let c = col % 8;
                (
                    row * k / 8 + col / 8,
                    if c.is_multiple_of(2) {
                        c / 2
                    } else {
                        4 + c / 2
                    },
                )
            }
            CodeOrder::Tiles => {
                let (tile_row, r) = (row / 16, row % 16);
                let (chunk, c) = (col / 64, col % 64);
                let (m, within) = (c / 16, c % 16);
                // Pair p covers rows g + 8 (p % 2) and columns 2t + 8 (p / 2), + 1.
                let (g, p_row) = (r % 8, r / 8);
                let (t, p_col, high) = ((within % 8) / 2, within / 8, within % 2);
                let lane = 4 * g + t;
                let tile = tile_row * (k / 64) + chunk;
                (tile * 128 + lane * 4 + m, p_row + 2 * p_col + 4 * high)
            }
        }
    }
}

/// Codes `q` (`[rows, k]` row-major, each below 16) packed in `order`: `[rows, k / 2]` bytes.
/// `k` must be a multiple of 8 (of 64, and `rows` of 16, for tiles).
pub fn pack_int4(q: &[u8], k: usize, order: CodeOrder) -> Vec<u8> {
    let rows = q.len() / k.max(1);
    assert!(
        k.is_multiple_of(8) && q.len() == rows * k,
        "pack_int4: k {k} must be a multiple of 8 and divide {} codes",
        q.len()
    );
    if order == CodeOrder::Tiles {
        assert!(
            k.is_multiple_of(64) && rows.is_multiple_of(16),
            "pack_int4: tiles need k a multiple of 64 and rows of 16, got [{rows}, {k}]"
        );
    }
    let mut words = vec![0u32; q.len() / 8];
    for (i, &code) in q.iter().enumerate() {
        let (word, nibble) = order.place(k, i / k, i % k);
        words[word] |= u32::from(code & 0xF) << (4 * nibble);
    }
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// The codes of `bytes` (`[rows, k / 2]` packed in `order`) back as `[rows, k]` row-major.
pub fn unpack_int4(bytes: &[u8], k: usize, order: CodeOrder) -> Vec<u8> {
    let codes = bytes.len() * 2;
    (0..codes)
        .map(|i| {
            let (word, nibble) = order.place(k, i / k, i % k);
            let w = u32::from_le_bytes(bytes[4 * word..4 * word + 4].try_into().expect("a word"));
            ((w >> (4 * nibble)) & 0xF) as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_put_even_columns_in_the_low_nibbles() {
        let q: Vec<u8> = (0..16).collect();
        let bytes = pack_int4(&q, 16, CodeOrder::Rows);
        let word = |i: usize| u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
        // Columns 0 2 4 6 in nibbles 0..3, 1 3 5 7 in nibbles 4..7.
        assert_eq!(word(0), 0x7531_6420);
        assert_eq!(word(1), 0xFDB9_ECA8);
    }

    #[test]
    fn tiles_give_each_lane_its_fragment() {
        // [32, 128]: two row tiles of two chunks. Code of (row, col) = a hash of both.
        let (rows, k) = (32, 128);
        let code = |r: usize, c: usize| ((r * 7 + c * 3 + r * c) % 16) as u8;
        let q: Vec<u8> = (0..rows * k).map(|i| code(i / k, i % k)).collect();
        let bytes = pack_int4(&q, k, CodeOrder::Tiles);
        assert_eq!(bytes.len(), rows * k / 2);
        // Lane 13 (g 3, t 1) of tile (row tile 1, chunk 1), word 2 (columns 32..48 of the chunk).
        let at = ((2 + 1) * 128 + 13 * 4 + 2) * 4;
        let w = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        let (r0, c0) = (16 + 3, 64 + 32 + 2);
        let pairs = [(r0, c0), (r0 + 8, c0), (r0, c0 + 8), (r0 + 8, c0 + 8)];
        for (p, (r, c)) in pairs.into_iter().enumerate() {
            assert_eq!((w >> (4 * p)) & 0xF, u32::from(code(r, c)), "pair {p} low");
            assert_eq!(
                (w >> (16 + 4 * p)) & 0xF,
                u32::from(code(r, c + 1)),
                "pair {p} high"
            );
        }
        for order in [CodeOrder::Rows, CodeOrder::Tiles] {
            assert_eq!(unpack_int4(&pack_int4(&q, k, order), k, order), q);
        }
    }

    #[test]
    fn tiles_only_where_they_fit() {
        assert_eq!(CodeOrder::best_for((4096, 4096), 128), CodeOrder::Tiles);
        assert_eq!(CodeOrder::best_for((576, 1536), 1536), CodeOrder::Tiles);
        for (shape, group) in [((1000, 4096), 128), ((64, 96), 96), ((64, 128), 32)] {
            assert_eq!(
                CodeOrder::best_for(shape, group),
                CodeOrder::Rows,
                "{shape:?}"
            );
        }
    }
}
