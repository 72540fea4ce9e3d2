//! A decode step's inputs and outputs between host and GPU. The sampling kernel: argmax rows
//! equal the host argmax (ties to the lowest index), seeded draws follow softmax(logits / t) and
//! respect min_p, and a row's draw depends on its seed only. The staging buffer's kernel copies
//! each input field into its tensor and nothing else. Under a bitmask (constrained decoding),
//! every row picks an allowed token: the best allowed one when greedy, the host's Gumbel-max
//! among the allowed ones when drawing.
//! Needs a CUDA GPU.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{StagedField, Staging, sample, sample_masked};

fn run(logits: &[Vec<f32>], temps: &[f32], min_ps: &[f32], seeds: &[i64]) -> Vec<u32> {
    let dev = Device::new_cuda(0).unwrap();
    let (rows, vocab) = (logits.len(), logits[0].len());
    let l = Tensor::from_vec(logits.concat(), (rows, vocab), &dev).unwrap();
    let t = Tensor::from_slice(temps, rows, &dev).unwrap();
    let m = Tensor::from_slice(min_ps, rows, &dev).unwrap();
    let s = Tensor::from_slice(seeds, rows, &dev).unwrap();
    sample(&l, &t, &m, &s).unwrap().to_vec1::<u32>().unwrap()
}

fn pseudo_logits(rows: usize, vocab: usize) -> Vec<Vec<f32>> {
    let mut x = 12345u64;
    (0..rows)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((x >> 40) % 1000) as f32 / 100.0
                })
                .collect()
        })
        .collect()
}

#[test]
fn greedy_rows_take_the_first_maximum() {
    let mut logits = pseudo_logits(64, 128_256);
    logits[3][7] = 50.0;
    logits[3][90_000] = 50.0; // a tie: the lower index wins
    logits[5] = vec![f32::NEG_INFINITY; 128_256];
    logits[6][100] = f32::NAN;
    let got = run(&logits, &[0.0; 64], &[0.0; 64], &[0; 64]);
    for (r, row) in logits.iter().enumerate() {
        let mut want = 0;
        for (i, &x) in row.iter().enumerate() {
            if x > row[want] {
                want = i;
            }
        }
        assert_eq!(got[r], want as u32, "row {r}");
    }
    assert_eq!(got[3], 7);
}

#[test]
fn seeded_draws_follow_the_tempered_softmax_and_min_p() {
    let base = vec![2.0f32, 1.0, 0.5, 0.0, -1.0, -3.0, f32::NEG_INFINITY, 1.5];
    let rows = 40_000;
    let t = 0.8f32;
    let logits = vec![base.clone(); rows];
    let seeds: Vec<i64> = (0..rows as i64).map(|i| i * 7919 + 1).collect();
    let got = run(&logits, &vec![t; rows], &vec![0.0; rows], &seeds);
    let z: f32 = base.iter().map(|x| (x / t).exp()).sum();
    for (tok, x) in base.iter().enumerate() {
        let p = (x / t).exp() / z;
        let freq = got.iter().filter(|&&g| g as usize == tok).count() as f32 / rows as f32;
        // 40k draws: the standard error is below 0.0025.
        assert!((freq - p).abs() < 0.01, "token {tok}: {freq} vs {p}");
    }
    // min_p 0.3 at t = 0.8 keeps tokens within 0.8 * ln(1/0.3) = 0.96 of the max: 0 and 7.
    let got = run(&logits, &vec![t; rows], &vec![0.3; rows], &seeds);
    assert!(got.iter().all(|&g| g == 0 || g == 7));
    assert!(got.contains(&7), "min_p must not collapse to greedy");
}

#[test]
fn a_rows_draw_depends_on_its_seed_alone() {
    let logits = pseudo_logits(32, 1000);
    let seeds: Vec<i64> = (0..32).map(|i| 1000 + i).collect();
    let all = run(&logits, &[1.0; 32], &[0.0; 32], &seeds);
    // Row 9 alone, then inside a reversed batch: same token.
    let alone = run(&logits[9..10], &[1.0], &[0.0], &seeds[9..10]);
    assert_eq!(alone[0], all[9]);
    let mut rev_logits = logits.clone();
    rev_logits.reverse();
    let mut rev_seeds = seeds.clone();
    rev_seeds.reverse();
    let rev = run(&rev_logits, &[1.0; 32], &[0.0; 32], &rev_seeds);
    assert_eq!(rev[31 - 9], all[9]);
    // Different seeds give different draws somewhere.
    let other: Vec<i64> = seeds.iter().map(|s| s + 1_000_000).collect();
    assert_ne!(run(&logits, &[1.0; 32], &[0.0; 32], &other), all);
}

/// The kernel's noise, on the host: splitmix64 of (seed, token index), mapped into (0, 1).
fn uniform(seed: u64, i: usize) -> f32 {
    fn splitmix64(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }
    let h = splitmix64(seed ^ splitmix64(i as u64));
    ((h >> 40) as f32 + 0.5) * (1.0 / 16_777_216.0)
}

#[test]
fn a_large_vocabulary_draws_the_same_token_as_the_gumbel_max_on_the_host() {
    // 128,256 tokens: the row is searched in many chunks; the winner must be the row's own.
    let (rows, vocab) = (24, 128_256);
    let logits = pseudo_logits(rows, vocab);
    let seeds: Vec<i64> = (0..rows as i64).map(|i| 31 * i + 5).collect();
    let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.7, 1.0, 1.3][r % 4]).collect();
    let min_ps: Vec<f32> = (0..rows)
        .map(|r| [0.0, 0.0, 0.05, 0.5][(r / 4) % 4])
        .collect();
    let got = run(&logits, &temps, &min_ps, &seeds);
    for r in 0..rows {
        let row = &logits[r];
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let (t, min_p) = (temps[r], min_ps[r]);
        let score = |i: usize| row[i] / t - (-uniform(seeds[r] as u64, i).ln()).ln();
        let want = if t <= 0.0 {
            row.iter().position(|&x| x == max).unwrap()
        } else {
            let floor = if min_p > 0.0 {
                max + t * min_p.ln()
            } else {
                f32::NEG_INFINITY
            };
            (0..vocab)
                .filter(|&i| row[i] >= floor)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
                .unwrap()
        };
        let g = got[r] as usize;
        if g != want {
            // Only a near-tie that the GPU's and the host's logarithms round apart may differ.
            assert!(
                t > 0.0 && (score(g) - score(want)).abs() < 1e-4,
                "row {r}: {g} vs {want}"
            );
            let floor = if min_p > 0.0 {
                max + t * min_p.ln()
            } else {
                f32::NEG_INFINITY
            };
            assert!(
                row[g] >= floor,
                "row {r}: token {g} is below the min_p floor"
            );
        }
    }
}

#[test]
fn masked_rows_pick_only_allowed_tokens() {
    let dev = Device::new_cuda(0).unwrap();
    let (rows, vocab): (usize, usize) = (16, 128_256);
    let words = vocab.div_ceil(32) + 3; // wider than needed, as a padded mask may be
    let logits = pseudo_logits(rows, vocab);
    let mut bits = vec![0u32; rows * words];
    let mut allowed: Vec<Vec<usize>> = Vec::new();
    for r in 0..rows {
        // A handful of tokens spread over the row (and its last word), never its argmax.
        let row: Vec<usize> = (0..5)
            .map(|k| (r * 7919 + k * 25_013) % vocab)
            .chain([vocab - 1])
            .collect();
        for &i in &row {
            bits[r * words + i / 32] |= 1 << (i % 32);
        }
        allowed.push(row);
    }
    // Row 15 allows nothing: token 0, by contract.
    bits[15 * words..16 * words].fill(0);
    let temps: Vec<f32> = (0..rows)
        .map(|r| if r % 2 == 0 { 0.0 } else { 1.0 })
        .collect();
    let seeds: Vec<i64> = (0..rows as i64).map(|i| 17 * i + 3).collect();
    let t = |v: &[f32]| Tensor::from_slice(v, rows, &dev).unwrap();
    let got = sample_masked(
        &Tensor::from_vec(logits.concat(), (rows, vocab), &dev).unwrap(),
        &t(&temps),
        &t(&[0.0; 16]),
        &Tensor::from_slice(&seeds, rows, &dev).unwrap(),
        &Tensor::from_vec(bits, (rows, words), &dev).unwrap(),
    )
    .unwrap()
    .to_vec1::<u32>()
    .unwrap();
    for r in 0..15 {
        let row = &logits[r];
        let score = |i: usize| {
            if temps[r] == 0.0 {
                row[i]
            } else {
                row[i] - (-uniform(seeds[r] as u64, i).ln()).ln()
            }
        };
        let want = *allowed[r]
            .iter()
            .max_by(|&&a, &&b| score(a).total_cmp(&score(b)).then(b.cmp(&a)))
            .unwrap();
        assert_eq!(got[r] as usize, want, "row {r}");
    }
    assert_eq!(got[15], 0);
}

#[test]
fn half_precision_logits_pick_what_their_f32_cast_picks() {
    use candle_core::DType;
    let dev = Device::new_cuda(0).unwrap();
    let rows = 24;
    let vocab = 50_000;
    let f32_logits =
        Tensor::from_vec(pseudo_logits(rows, vocab).concat(), (rows, vocab), &dev).unwrap();
    // Greedy, plain draws and min-p draws, each with its own seed.
    let temps: Vec<f32> = (0..rows).map(|r| [0.0, 0.7, 1.3][r % 3]).collect();
    let min_ps: Vec<f32> = (0..rows)
        .map(|r| if r % 4 == 3 { 0.2 } else { 0.0 })
        .collect();
    let seeds: Vec<i64> = (0..rows as i64).map(|r| r * 31 + 5).collect();
    let t = Tensor::from_slice(&temps, rows, &dev).unwrap();
    let m = Tensor::from_slice(&min_ps, rows, &dev).unwrap();
    let s = Tensor::from_slice(&seeds, rows, &dev).unwrap();
    for dtype in [DType::BF16, DType::F16] {
        let half = f32_logits.to_dtype(dtype).unwrap();
        let want = sample(&half.to_dtype(DType::F32).unwrap(), &t, &m, &s)
            .unwrap()
            .to_vec1::<u32>()
            .unwrap();
        let got = sample(&half, &t, &m, &s).unwrap().to_vec1::<u32>().unwrap();
        assert_eq!(got, want, "{dtype:?}");
        // The allocation-free form writes the same ids into a larger buffer, over old contents.
        let out = Tensor::full(u32::MAX, rows + 3, &dev).unwrap();
        let parts = Tensor::zeros(
            pagewise_kernels::sample_workspace_len(rows, vocab),
            DType::F32,
            &dev,
        )
        .unwrap();
        let host = pagewise_kernels::PinnedIds::new(rows).unwrap();
        let copy = Tensor::zeros((rows + 1, vocab), dtype, &dev).unwrap();
        let to = pagewise_kernels::SampleOutputs {
            ids: &out,
            host_ids: Some(&host),
            logits_copy: Some(&copy),
            workspace: &parts,
        };
        // Calls of different row counts over one workspace (as graph buckets share it): each
        // leaves it ready for the next.
        for (call, n) in [rows, 3, 1, rows - 5, rows].into_iter().enumerate() {
            let first = |x: &Tensor| x.narrow(0, 0, n).unwrap();
            pagewise_kernels::sample_into(&to, &first(&half), &first(&t), &first(&m), &first(&s))
                .unwrap();
            dev.synchronize().unwrap();
            let host_ids = host.read(n).unwrap();
            assert_eq!(
                host_ids,
                want[..n],
                "{dtype:?}: the host's copy, call {call}"
            );
        }
        assert!(host.read(rows + 1).is_err(), "reading past the pinned ids");
        let diff = (copy.narrow(0, 0, rows).unwrap() - &half).unwrap();
        let max = diff
            .abs()
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(
            max.to_scalar::<f32>().unwrap(),
            0.0,
            "{dtype:?}: the logits copy"
        );
        let written = out.to_vec1::<u32>().unwrap();
        assert_eq!(&written[..rows], &want[..], "{dtype:?} sample_into");
        assert_eq!(&written[rows..], &[u32::MAX; 3], "{dtype:?}: past the rows");
    }
    // Too small a workspace is refused, not overrun.
    let small = Tensor::zeros(8, DType::F32, &dev).unwrap();
    let out = Tensor::zeros(rows, DType::U32, &dev).unwrap();
    let to = |workspace, host_ids| pagewise_kernels::SampleOutputs {
        ids: &out,
        host_ids,
        logits_copy: None,
        workspace,
    };
    let err =
        pagewise_kernels::sample_into(&to(&small, None), &f32_logits, &t, &m, &s).unwrap_err();
    assert!(err.to_string().contains("workspace"), "{err}");
    // So is a host buffer too small for the rows.
    let parts = Tensor::zeros(
        pagewise_kernels::sample_workspace_len(rows, vocab),
        DType::F32,
        &dev,
    )
    .unwrap();
    let host = pagewise_kernels::PinnedIds::new(rows - 1).unwrap();
    let err = pagewise_kernels::sample_into(&to(&parts, Some(&host)), &f32_logits, &t, &m, &s)
        .unwrap_err();
    assert!(err.to_string().contains("host buffer"), "{err}");
}

#[test]
fn staged_fields_land_in_their_tensors_and_nothing_else_moves() {
    let dev = Device::new_cuda(0).unwrap();
    let ids = Tensor::full(7u32, 6, &dev).unwrap();
    let slots = Tensor::full(-9i64, 6, &dev).unwrap();
    let tables = Tensor::from_vec(vec![5i32; 32], (4, 8), &dev).unwrap();
    let mut staging = Staging::new(64).unwrap();
    let w = staging.words_mut();
    w[0] = 3; // the tables' width this step
    for i in 0..4 {
        w[1 + i] = 100 + i as u32;
        let slot = if i == 3 {
            -1i64
        } else {
            (1i64 << 33) + i as i64
        };
        w[5 + 2 * i] = slot as u32;
        w[6 + 2 * i] = (slot >> 32) as u32;
    }
    for r in 0..4 {
        for c in 0..8 {
            w[20 + r * 8 + c] = (r * 10 + c) as u32;
        }
    }
    let run = |dst, src_word, words| StagedField {
        dst,
        src_word,
        rows: 1,
        row_words: Some(words),
        src_row_words: 0,
        dst_row_words: 0,
    };
    staging
        .unpack(&[
            run(&ids, 1, 4),
            run(&slots, 5, 8),
            StagedField {
                dst: &tables,
                src_word: 20,
                rows: 3,
                row_words: None,
                src_row_words: 8,
                dst_row_words: 8,
            },
        ])
        .unwrap();
    assert_eq!(ids.to_vec1::<u32>().unwrap(), [100, 101, 102, 103, 7, 7]);
    let two33 = 1i64 << 33;
    assert_eq!(
        slots.to_vec1::<i64>().unwrap(),
        [two33, two33 + 1, two33 + 2, -1, -9, -9]
    );
    for (r, row) in tables.to_vec2::<i32>().unwrap().iter().enumerate() {
        for (c, &got) in row.iter().enumerate() {
            let want = if r < 3 && c < 3 {
                (r * 10 + c) as i32
            } else {
                5
            };
            assert_eq!(got, want, "table row {r} column {c}");
        }
    }
    // A field reaching past the buffer or its tensor is refused before any launch.
    let err = staging.unpack(&[run(&ids, 60, 6)]).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let err = staging.unpack(&[run(&ids, 1, 7)]).unwrap_err();
    assert!(err.to_string().contains("do not fit"), "{err}");
    let halves = Tensor::zeros(4, DType::F16, &dev).unwrap();
    assert!(staging.unpack(&[run(&halves, 1, 2)]).is_err());
}
