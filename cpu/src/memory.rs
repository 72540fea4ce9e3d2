//! The process's allocator, tuned for CPU inference: a step allocates and frees the same large
//! buffers again and again (a 4,096-token prefill of a 1B model makes activations of up to 256
//! MiB). glibc serves such blocks with a fresh `mmap` and returns them with `munmap`, so every
//! step pays the page faults and the kernel's zeroing of every page anew: a quarter of that
//! prefill (benches/RESULTS.md). Kept in the heap instead, freed memory is reused by the next
//! step; the cost is that the process keeps its peak heap.
//!
//! The KV cache is the exception ([`Zeroed`]): allocated once and zeroed, it is a mapping of its
//! own, whose pages the kernel supplies zeroed on first touch, so that a cache sized from the
//! machine's memory costs only the blocks that are used. From the heap, `calloc` would zero all
//! of it whenever it reuses freed memory (a second engine in one process).

use std::ops::{Deref, DerefMut};

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

/// `len` zeros (f32) in an anonymous mapping of their own: the kernel supplies each page zeroed
/// on first touch, and unmaps them on drop. Where no mapping can be made (or off Unix), a
/// zeroed `Vec`.
pub struct Zeroed(Inner);

enum Inner {
    #[cfg(unix)]
    Mapped {
        ptr: std::ptr::NonNull<f32>,
        len: usize,
    },
    Heap(Vec<f32>),
}

// SAFETY: the mapping is owned by this value alone, like a Vec's buffer.
unsafe impl Send for Zeroed {}
// SAFETY: shared access only reads (`Deref`); writes need `&mut`.
unsafe impl Sync for Zeroed {}

impl Zeroed {
    /// `len` zeros.
    pub fn new(len: usize) -> Self {
        #[cfg(unix)]
        if len > 0 {
            let bytes = len * std::mem::size_of::<f32>();
            // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
            let ptr = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if ptr != libc::MAP_FAILED
                && let Some(ptr) = std::ptr::NonNull::new(ptr.cast::<f32>())
            {
                return Zeroed(Inner::Mapped { ptr, len });
            }
        }
        Zeroed(Inner::Heap(vec![0.0; len]))
    }
}

impl Deref for Zeroed {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.0 {
            // SAFETY: `len` floats, mapped readable and writable for this value's life.
            #[cfg(unix)]
            Inner::Mapped { ptr, len } => unsafe { std::slice::from_raw_parts(ptr.as_ptr(), *len) },
            Inner::Heap(v) => v,
        }
    }
}

impl DerefMut for Zeroed {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut self.0 {
            // SAFETY: as in `deref`, and `&mut self` makes this the only access.
            #[cfg(unix)]
            Inner::Mapped { ptr, len } => unsafe {
                std::slice::from_raw_parts_mut(ptr.as_ptr(), *len)
            },
            Inner::Heap(v) => v,
        }
    }
}

impl Drop for Zeroed {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Inner::Mapped { ptr, len } = self.0 {
            // SAFETY: the mapping made in `new`, of that length, unmapped once.
            unsafe {
                libc::munmap(ptr.as_ptr().cast(), len * std::mem::size_of::<f32>());
            }
        }
    }
}

/// Bytes of memory this process can take without swapping: the system's `MemAvailable`
/// (/proc/meminfo), or less where the process's memory cgroup (a container's limit) leaves less;
/// `None` where neither is known.
pub fn available_memory() -> Option<u64> {
    let host = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| meminfo_available(&text));
    match (host, cgroup_headroom()) {
        (Some(h), Some(c)) => Some(h.min(c)),
        (h, c) => h.or(c),
    }
}

/// `MemAvailable` of a /proc/meminfo text, in bytes.
fn meminfo_available(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// What the memory cgroup of this process still allows (its limit less its usage), where it has
/// a limit: cgroup v2 (`memory.max`, `memory.current`) or v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`), at the process's own cgroup or, inside a container, the mount's root.
fn cgroup_headroom() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let (root, limit, usage) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max", "memory.current")
        } else if controllers.split(',').any(|c| c == "memory") {
            (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        } else {
            continue;
        };
        for dir in [format!("{root}{path}"), root.to_string()] {
            let read = |file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok();
            if let (Some(l), Some(u)) = (read(limit), read(usage)) {
                return headroom(&l, &u);
            }
        }
    }
    None
}

/// A cgroup's `limit` less its `usage` (their files' texts); `None` without a limit (`max`, or
/// v1's near-2^63 "unlimited").
fn headroom(limit: &str, usage: &str) -> Option<u64> {
    let limit: u64 = limit.trim().parse().ok().filter(|&l| l < 1 << 60)?;
    let usage: u64 = usage.trim().parse().ok()?;
    Some(limit.saturating_sub(usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes of `buf`'s pages that are in memory (`mincore`), counting whole pages.
    #[cfg(target_os = "linux")]
    fn resident_bytes(buf: &[f32]) -> usize {
        const PAGE: usize = 4096;
        let start = buf.as_ptr() as usize / PAGE * PAGE;
        let end = (buf.as_ptr() as usize + std::mem::size_of_val(buf)).div_ceil(PAGE) * PAGE;
        let mut flags = vec![0u8; (end - start) / PAGE];
        // SAFETY: the range covers `buf`'s pages, all mapped; `flags` has a byte per page.
        let rc =
            unsafe { libc::mincore(start as *mut libc::c_void, end - start, flags.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore");
        flags.iter().filter(|&&f| f & 1 == 1).count() * PAGE
    }

    /// A zeroed cache costs no memory until touched, even where the allocator holds freed
    /// blocks of its size (which `calloc` would have to zero), and only the pages written after.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_zeroed_cache_is_in_memory_only_where_used() {
        const BYTES: usize = 64 << 20;
        keep_freed_memory();
        drop(std::hint::black_box(vec![0u8; BYTES]));
        let mut cache = Zeroed::new(BYTES / 4);
        assert_eq!(resident_bytes(&cache), 0);
        assert!(cache.iter().step_by(1 << 16).all(|&x| x == 0.0));
        cache[12345] = 1.5;
        cache[BYTES / 4 - 1] = -2.0;
        // Two pages, or the kernel's larger pages around them (transparent huge pages).
        let touched = resident_bytes(&cache);
        assert!((2 * 4096..=2 * (2 << 20)).contains(&touched), "{touched}");
        assert_eq!(
            (cache[12345], cache[BYTES / 4 - 1], cache[0]),
            (1.5, -2.0, 0.0)
        );
        assert!(Zeroed::new(0).is_empty());
    }

    #[test]
    fn a_containers_memory_limit_bounds_what_is_available() {
        assert_eq!(headroom("4294967296\n", "1073741824\n"), Some(3 << 30));
        assert_eq!(headroom("max\n", "1073741824\n"), None);
        assert_eq!(headroom("9223372036854771712", "17839263744"), None);
        assert_eq!(headroom("1024", "4096"), Some(0));
        let meminfo = "MemTotal:       24000000 kB\nMemAvailable:   21000000 kB\n";
        assert_eq!(meminfo_available(meminfo), Some(21_000_000 * 1024));
    }

    #[test]
    fn available_memory_is_read_where_the_system_reports_it() {
        if std::path::Path::new("/proc/meminfo").exists() {
            let bytes = available_memory().expect("MemAvailable");
            assert!(bytes > 16 << 20, "{bytes}");
        }
    }
}
