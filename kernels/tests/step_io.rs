//! A step's inputs and outputs between host and GPU: the staging buffer's kernel copies each
//! field (4- and 8-byte elements, rows of a run-time width) into its tensor and nothing else, and
//! page-locked ids come back from an async copy. Needs a CUDA GPU.

use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{PinnedIds, StagedField, Staging};

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

#[test]
fn pinned_ids_come_back_after_a_synchronize() {
    let dev = Device::new_cuda(0).unwrap();
    let src = Tensor::from_vec(vec![3u32, 1, 4, 1, 5], 5, &dev).unwrap();
    let mut pinned = PinnedIds::new(8).unwrap();
    pinned.copy_from(&src.narrow(0, 1, 3).unwrap()).unwrap();
    dev.synchronize().unwrap();
    assert_eq!(pinned.read(4).unwrap(), [1, 4, 1, 0]);
    assert!(pinned.read(9).is_err());
    let long = Tensor::zeros(9, DType::U32, &dev).unwrap();
    assert!(pinned.copy_from(&long).is_err());
}
