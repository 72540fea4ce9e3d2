//! Deliberate failures, for the tests of the failure paths (cargo feature `fault-injection`, which
//! only the test build turns on; a release build has none of this). Each fault fires for the
//! sequences whose prompt holds its token id, so a test chooses which request meets it.

use crate::sequence::SeqId;

/// Which faults are armed (all off by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// The engine thread panics (a bug) when it schedules a sequence whose prompt holds this token.
    pub panic_on_token: Option<u32>,
    /// The step fails as a device fault would when it schedules such a sequence.
    pub device_error_on_token: Option<u32>,
    /// The text phase of every sequence whose prompt holds this token fails (a failure that
    /// belongs to that request alone).
    pub request_error_on_token: Option<u32>,
}

/// The sequences a step-level fault waits for.
#[derive(Debug, Default)]
pub(crate) struct ArmedFaults {
    faults: Faults,
    panic_seqs: Vec<SeqId>,
    device_error_seqs: Vec<SeqId>,
}

impl ArmedFaults {
    /// Faults as configured, no sequence marked yet.
    pub fn new(faults: Faults) -> Self {
        ArmedFaults {
            faults,
            ..Default::default()
        }
    }

    /// Marks sequence `id` with `prompt` for the faults its prompt triggers; returns whether its
    /// text phase must fail.
    pub fn on_add(&mut self, id: SeqId, prompt: &[u32]) -> bool {
        let holds = |t: Option<u32>| t.is_some_and(|t| prompt.contains(&t));
        if holds(self.faults.panic_on_token) {
            self.panic_seqs.push(id);
        }
        if holds(self.faults.device_error_on_token) {
            self.device_error_seqs.push(id);
        }
        holds(self.faults.request_error_on_token)
    }

    /// Fires the step-level fault of any marked sequence among `scheduled`.
    pub fn on_step(&self, scheduled: impl Iterator<Item = SeqId>) -> Result<(), String> {
        for id in scheduled {
            if self.panic_seqs.contains(&id) {
                panic!("injected engine panic");
            }
            if self.device_error_seqs.contains(&id) {
                return Err("injected device fault".into());
            }
        }
        Ok(())
    }
}
