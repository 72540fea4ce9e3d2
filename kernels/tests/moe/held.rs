//! Expert parallelism's routes (`MoeRoutes::held`) against the whole stack's.

use super::DenseLayer;
use crate::common::{Lcg, host_f32, max_rel_diff};
use candle_core::{DType, Device, Tensor};
use pagewise_kernels::{moe_experts, moe_route};

/// Expert parallelism: a rank's stack holds a run of whole experts, and the routes made for it
/// (`MoeRoutes::held`) send the slots of other ranks' experts nowhere (weight 0). The ranks'
/// outputs sum to the whole stack's, for runs of unequal length, one expert, and a rank that
/// no token routes to.
#[test]
fn held_routes_split_the_experts_whole_over_ranks() {
    let dev = Device::new_cuda(0).unwrap();
    let mut rng = Lcg(21);
    let (tokens, hidden, inter, experts, top_k) = (5, 256, 512, 8, 2);
    let layer = DenseLayer::random(
        &mut rng,
        DType::BF16,
        (tokens, hidden, inter, experts, top_k),
        &dev,
    );
    let whole = host_f32(&moe_experts(&layer.x, &layer.gu, &layer.down, &layer.routes).unwrap());
    let ids = layer
        .routes
        .ids()
        .flatten_all()
        .unwrap()
        .to_vec1::<u32>()
        .unwrap();
    let weights = host_f32(layer.routes.weights());
    for runs in [vec![0..4, 4..8], vec![0..3, 3..6, 6..8], vec![0..1, 1..8]] {
        let mut sum = vec![0f32; tokens * hidden];
        for run in &runs {
            let held = layer.routes.held(run.start, run.len()).unwrap();
            let (hids, hw) = (
                held.ids().flatten_all().unwrap().to_vec1::<u32>().unwrap(),
                host_f32(held.weights()),
            );
            for s in 0..ids.len() {
                let inside = run.contains(&(ids[s] as usize));
                assert!((hids[s] as usize) < run.len(), "slot {s}: {}", hids[s]);
                match inside {
                    true => assert_eq!(
                        (hids[s] as usize + run.start, hw[s]),
                        (ids[s] as usize, weights[s])
                    ),
                    false => assert_eq!(hw[s], 0.0, "slot {s} of expert {} in {run:?}", ids[s]),
                }
            }
            let part = |t: &Tensor| {
                t.narrow(0, run.start, run.len())
                    .unwrap()
                    .contiguous()
                    .unwrap()
            };
            let y = moe_experts(&layer.x, &part(&layer.gu), &part(&layer.down), &held).unwrap();
            for (a, b) in sum.iter_mut().zip(host_f32(&y)) {
                *a += b;
            }
        }
        let err = max_rel_diff(&sum, &whole);
        assert!(err < 1e-2, "{runs:?}: off by {err}");
    }
    // A rank nobody routes to adds nothing.
    let logits = Tensor::from_vec(
        (0..tokens * experts)
            .map(|i| if i % experts < 2 { 5.0 } else { 0.0 })
            .collect::<Vec<f32>>(),
        (tokens, experts),
        &dev,
    )
    .unwrap();
    let routes = moe_route(&logits, top_k, true).unwrap();
    let idle = routes.held(4, 4).unwrap();
    assert!(host_f32(idle.weights()).iter().all(|&w| w == 0.0));
    let part = |t: &Tensor| t.narrow(0, 4, 4).unwrap().contiguous().unwrap();
    let y = moe_experts(&layer.x, &part(&layer.gu), &part(&layer.down), &idle).unwrap();
    assert!(host_f32(&y).iter().all(|&v| v == 0.0));
    assert!(routes.held(6, 3).is_err() && routes.held(0, 0).is_err());
    // Captured in a CUDA graph, as decode steps run (nothing copied from the host).
    let (gu, down) = (part(&layer.gu), part(&layer.down));
    let stream = dev.as_cuda_device().unwrap().cuda_stream();
    let run = |_| {
        let held = layer.routes.held(4, 4).unwrap();
        moe_experts(&layer.x, &gu, &down, &held).unwrap();
    };
    crate::common::graph_replay_seconds(&stream, 1, &run);
}
