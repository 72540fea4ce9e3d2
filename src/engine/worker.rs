//! A worker rank's life: load its shard (joining the group), then compute every step rank 0
//! sends until rank 0 says stop. Rank 0 going away without a word (a crash, a lost host) ends
//! the process with an error at once, even while a collective is waiting for it.

use std::sync::mpsc;

use super::args::{EngineArgs, EngineError};
use super::loading;
use crate::parallel::group::Member;
use crate::parallel::wire::{Kind, decode_step};
use crate::scheduler::SchedulerOutput;

/// Runs this process as rank `args.parallel.rank()` (not 0) until rank 0 stops the group.
pub fn run(args: &EngineArgs) -> Result<(), EngineError> {
    let loaded = loading::load(args)?;
    let Some(Member::Follower(follower)) = loaded.member else {
        return Err(EngineError::Parallel(
            "rank 0 runs the engine itself, not a worker loop".into(),
        ));
    };
    let rank = args.parallel.rank().rank;
    let mut runner = loaded.runner;
    let mut link = follower.link;
    tracing::info!(rank, "worker ready");
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(8);
    std::thread::Builder::new()
        .name("pagewise-tp-link".into())
        .spawn(move || {
            loop {
                match link.recv() {
                    Ok((Kind::Step, plan)) => {
                        if tx.send(plan).is_err() {
                            return; // the compute loop ended (with an error, reported there)
                        }
                    }
                    Ok((Kind::Stop, _)) => return,
                    Ok((kind, _)) => {
                        tracing::error!(rank, "unexpected {kind:?} from rank 0; exiting");
                        std::process::exit(1);
                    }
                    Err(e) => {
                        tracing::error!(rank, "rank 0 went away ({e}); exiting");
                        std::process::exit(1);
                    }
                }
            }
        })
        .map_err(|e| EngineError::Parallel(format!("cannot start the link thread: {e}")))?;
    let mut out = SchedulerOutput::default();
    while let Ok(plan) = rx.recv() {
        decode_step(&plan, &mut out)
            .map_err(|e| EngineError::Parallel(format!("a bad step plan from rank 0: {e}")))?;
        runner.forward_only(&out)?;
    }
    tracing::info!(rank, "rank 0 stopped the group");
    drop(runner);
    tracing::info!(rank, "worker done");
    Ok(())
}
