//! The prefill kernels give each activation row the dots it gets alone: the 8- and 4-row tiles
//! and the 512-bit two-group kernels (`avx512_pair`, taken for 4 rows or more where the CPU has
//! AVX-512) sum the same integers and scale them in the same order as the one-row kernel, so a
//! row's output does not depend on how many rows share its matmul. On a CPU without AVX-512 the
//! pairs do not run and this checks the tiles alone.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::QLinear;
use super::iq4::Iq4Type;
use super::kernels::Isa;
use super::team::Team;
use super::tests::{Rng, random_input};
use super::tests_iq4;

#[test]
fn a_rows_dots_do_not_depend_on_the_rows_beside_it() {
    let (rows, cols, m) = (40, 512, 13);
    let w = Tensor::from_vec(random_input(rows * cols, 41), (rows, cols), &Device::Cpu).unwrap();
    let mut layers: Vec<(String, QLinear)> = [
        GgmlDType::Q2K,
        GgmlDType::Q3K,
        GgmlDType::Q4K,
        GgmlDType::Q5K,
        GgmlDType::Q6K,
    ]
    .into_iter()
    .map(|dtype| {
        let q = QTensor::quantize(&w, dtype).unwrap();
        let layer = QLinear::from_gguf(dtype, &q.data().unwrap(), rows, cols).unwrap();
        (format!("{dtype:?}"), layer)
    })
    .collect();
    let xs_cols = tests_iq4::width(Iq4Type::Xs);
    let bytes = tests_iq4::iq4_bytes(Iq4Type::Xs, rows, xs_cols, &mut Rng(42));
    layers.push((
        "IQ4_XS".into(),
        QLinear::from_iq4(Iq4Type::Xs, &bytes, rows, xs_cols).unwrap(),
    ));
    for (name, layer) in &layers {
        let cols = layer.cols();
        let x = random_input(m * cols, 43);
        for isa in Isa::available() {
            // 1, 2 and 3 members: shares of one, two and three groups (a pair and a single).
            for size in [1, 2, 3] {
                let team = Team::new(size);
                let all = layer.matmul_with(isa, &team, &x, m);
                for i in 0..m {
                    let alone = layer.matmul_with(isa, &team, &x[i * cols..(i + 1) * cols], 1);
                    assert_eq!(
                        &all[i * rows..(i + 1) * rows],
                        &alone[..],
                        "{name} {isa:?} team {size}: row {i} of {m}"
                    );
                }
            }
        }
    }
}
