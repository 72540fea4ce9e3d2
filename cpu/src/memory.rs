//! The process's allocator, tuned for CPU inference: a step allocates and frees the same large
//! buffers again and again (a 4,096-token prefill of a 1B model makes activations of up to 256
//! MiB). glibc serves such blocks with a fresh `mmap` and returns them with `munmap`, so every
//! step pays the page faults and the kernel's zeroing of every page anew: a quarter of that
//! prefill (benches/RESULTS.md). Kept in the heap instead, freed memory is reused by the next
//! step; the cost is that the process keeps its peak heap.

/// Makes glibc's `malloc` serve large blocks from its heap and keep what is freed (up to 2 GiB
/// at the top of the heap), instead of mapping and unmapping each. Once a process; elsewhere
/// than Linux with glibc, nothing.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            // SAFETY: mallopt only sets allocator parameters; it takes the allocator's own lock.
            unsafe {
                libc::mallopt(libc::M_MMAP_MAX, 0);
                libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
            }
        });
    }
}
