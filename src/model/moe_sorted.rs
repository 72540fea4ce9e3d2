//! A step's routes sorted by expert for the grouped GEMMs of a mixture's larger steps
//! (`moe_device::Stacked::forward_grouped`): a counting sort of the route slots over the experts
//! a stack holds.

/// A step's routes sorted by expert: route slot `t * top_k + j` is token t's j-th expert.
pub(super) struct SortedRoutes {
    /// `(expert, rows)` for every held expert in turn (its index in the stack): the grouped
    /// GEMMs' groups.
    pub groups: Vec<(usize, usize)>,
    /// Sorted row i's token.
    pub token_of: Vec<u32>,
    /// Slot s's sorted row; one past the last row for a slot whose expert is not held.
    pub position: Vec<u32>,
}

impl SortedRoutes {
    /// Sorts the slots of `ids` (each slot's expert) whose experts are `held` by expert, in slot
    /// order within an expert; the others are left out.
    pub fn new(ids: &[u32], held: std::ops::Range<usize>, top_k: usize) -> SortedRoutes {
        let local = |e: u32| {
            (e as usize)
                .checked_sub(held.start)
                .filter(|&l| l < held.len())
        };
        let mut counts = vec![0usize; held.len()];
        for &e in ids {
            if let Some(l) = local(e) {
                counts[l] += 1;
            }
        }
        let rows: usize = counts.iter().sum();
        let mut next: Vec<usize> = counts
            .iter()
            .scan(0, |start, &c| {
                let first = *start;
                *start += c;
                Some(first)
            })
            .collect();
        let mut token_of = vec![0u32; rows];
        let mut position = vec![rows as u32; ids.len()];
        for (slot, &e) in ids.iter().enumerate() {
            let Some(l) = local(e) else { continue };
            let row = next[l];
            next[l] += 1;
            token_of[row] = (slot / top_k) as u32;
            position[slot] = row as u32;
        }
        SortedRoutes {
            groups: counts.into_iter().enumerate().collect(),
            token_of,
            position,
        }
    }
}
