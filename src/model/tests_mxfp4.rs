//! MXFP4's codes and scales read as gpt-oss's safetensors and llama.cpp's GGUF blocks hold them.

use super::*;

#[test]
fn codes_take_the_low_nibble_first_and_the_block_scale() {
    // Codes 1 (0.5) and 15 (-6) in the first byte, 7 (6) and 8 (-0) in the second.
    let mut block = [0u8; 16];
    block[0] = 0xF1;
    block[1] = 0x87;
    let mut out = Vec::new();
    dequantize(&block, &[127 + 2], &mut out); // scale 4
    assert_eq!(out.len(), 32);
    assert_eq!(&out[..4], &[2.0, -24.0, 24.0, -0.0]);
    assert!(out[4..].iter().all(|&x| x == 0.0));
    out.clear();
    dequantize(&[0x22; 16], &[127 - 3], &mut out); // code 2 (1.0) times 1/8
    assert!(out.iter().all(|&x| x == 0.125));
}

#[test]
fn ggml_blocks_repack_to_the_pairs_safetensors_use() {
    // Two rows of one run each: the same values whether read from ggml's blocks or from
    // the repacked codes.
    let mut blocks = Vec::new();
    for r in 0..2u8 {
        blocks.push(120 + r);
        blocks.extend((0..16u8).map(|i| i.wrapping_mul(37).wrapping_add(r)));
    }
    let host = Mxfp4Host::from_ggml(&blocks, (1, 2, 32));
    let mut want = Vec::new();
    dequantize_ggml(&blocks, &mut want);
    assert_eq!(host.dequantize_expert(0), want);
    assert_eq!(host.scales, [120, 121]);
}

#[test]
fn interleaved_rows_become_the_gate_rows_then_the_up_rows() {
    // 2 experts of 4 rows of one run: row r's codes all r + 4e, its scale 100 + r + 4e.
    let (codes, scales): (Vec<u8>, Vec<u8>) = (0..8u8).map(|r| (vec![r; 16], 100 + r)).fold(
        (Vec::new(), Vec::new()),
        |(mut c, mut s), (rc, rs)| {
            c.extend(rc);
            s.push(rs);
            (c, s)
        },
    );
    let host = Mxfp4Host {
        codes,
        scales,
        dims: (2, 4, 32),
    };
    let halves = host.halves_from_interleaved();
    assert_eq!(halves.scales, [100, 102, 101, 103, 104, 106, 105, 107]);
    assert_eq!(halves.codes[16..32], [2; 16]);
    let stacked = Mxfp4Host::stack_rows(&host, &halves);
    assert_eq!(stacked.dims, (2, 8, 32));
    assert_eq!(
        stacked.scales,
        [
            100, 101, 102, 103, 100, 102, 101, 103, 104, 105, 106, 107, 104, 106, 105, 107
        ]
    );
}

#[test]
fn a_rank_takes_its_rows_of_each_half_and_its_runs_of_columns() {
    // 1 expert, 4 rows (2 gate, 2 up) of 64 columns: every value tells its row and run.
    let mut host = Mxfp4Host::random((1, 4, 64), 3);
    host.scales = (0..8).map(|i| 100 + i).collect();
    let full: Vec<Vec<f32>> = host
        .dequantize_expert(0)
        .chunks(64)
        .map(<[f32]>::to_vec)
        .collect();
    // Gate row 1 and up row 1 (old rows 1 and 3).
    let part = host.halves_part(&(1..2));
    assert_eq!(part.dims, (1, 2, 64));
    assert_eq!(part.dequantize_expert(0), [&full[1][..], &full[3]].concat());
    // The second run of each row.
    let cols = host.cols_part(&(32..64));
    assert_eq!(cols.dims, (1, 4, 32));
    assert_eq!(cols.scales, [101, 103, 105, 107]);
    let want: Vec<f32> = full.iter().flat_map(|r| r[32..].to_vec()).collect();
    assert_eq!(cols.dequantize_expert(0), want);
}

#[test]
fn gguf_tensors_are_read_from_the_file_when_asked_for() {
    // A 2 x 64 tensor (four ggml blocks) after 5 bytes of something else.
    let blocks: Vec<u8> = (0..4 * GGML_BLOCK_BYTES as u32)
        .map(|i| match i as usize % GGML_BLOCK_BYTES {
            0 => 120 + (i / 17) as u8,
            _ => (i * 29 % 251) as u8,
        })
        .collect();
    let path = std::env::temp_dir().join(format!("pagewise-mxfp4-{}.bin", std::process::id()));
    std::fs::write(&path, [&[7u8; 5][..], &blocks].concat()).unwrap();
    let shapes = HashMap::from([
        ("blk.0.ffn_down_exps.weight".to_string(), (vec![2, 64], 2)),
        ("blk.1.ffn_down_exps.weight".to_string(), (vec![4, 64], 2)),
    ]);
    let file = GgufMxfp4::new(path.clone(), 3, &shapes);
    assert_eq!(file.num_params(), 128 + 256);
    let host = file.host("blk.0.ffn_down_exps.weight").unwrap().unwrap();
    assert_eq!(host, Mxfp4Host::from_ggml(&blocks, (1, 2, 64)));
    let dense = file
        .dequantized("blk.0.ffn_down_exps.weight", DType::F32, &Device::Cpu)
        .unwrap()
        .unwrap();
    let mut want = Vec::new();
    dequantize_ggml(&blocks, &mut want);
    assert_eq!(dense.dims(), [2, 64]);
    assert_eq!(dense.flatten_all().unwrap().to_vec1::<f32>().unwrap(), want);
    assert!(file.host("blk.0.ffn_up_exps.weight").unwrap().is_none());
    // Past the end of the file: an error naming the tensor.
    let e = file
        .host("blk.1.ffn_down_exps.weight")
        .unwrap_err()
        .to_string();
    assert!(e.contains("blk.1.ffn_down_exps.weight"), "{e}");
    std::fs::remove_file(path).unwrap();
}

#[test]
fn ggml_blocks_hold_the_low_nibbles_first_then_the_high_ones() {
    let mut block = [0u8; GGML_BLOCK_BYTES];
    block[0] = 127 + 1; // scale 2
    block[1] = 0xF1; // value 0: code 1 (0.5), value 16: code 15 (-6)
    block[16] = 0x72; // value 15: code 2 (1.0), value 31: code 7 (6)
    let mut out = Vec::new();
    dequantize_ggml(&block, &mut out);
    assert_eq!(out.len(), 32);
    assert_eq!((out[0], out[16], out[15], out[31]), (1.0, -12.0, 2.0, 12.0));
    assert!(out[1..15].iter().chain(&out[17..31]).all(|&x| x == 0.0));
}
