//! The same-host lane of a `ucx://` connection: a ring of shared memory per direction, made
//! by the sender, mapped by the receiver, through which large host frames travel instead of
//! UCX's rendezvous (docs/transport.md, "Which lane carries what on one host").
//!
//! With peer error handling UCX leaves its kernel-copy transport (CMA) out, and a rendezvous
//! over shared memory is a pipeline of 8 KiB copies through UCX's FIFO in which every
//! fragment waits for the other process to progress: a sender busy with tasks holds up its
//! receiver. Through the ring the sender copies a frame once, when it sends it, and sends a
//! small plan (where the frames are) over UCX; the receiver copies the frame out when the
//! plan arrives, needing nothing more from the sender. A dead sender still fails the
//! receive (the plan travels over UCX with its error handling), and the ring stays mapped
//! (sealed against shrinking: no page can vanish under a reader).
//!
//! **The memory** is a `memfd`: a control page (the count of frames the receiver has
//! copied out, written by the receiver), then the ring. The sender creates it, seals its size
//! and offers it (its pid, the descriptor's number, inode and device, the ring's size); the
//! receiver takes the descriptor with `pidfd_getfd` (it needs the right to ptrace the sender,
//! as UCX's CMA does), checks that it is the file offered and sealed, and maps the ring
//! read-only. A peer on another host, in another pid namespace or that cannot be traced
//! fails the check, and the connection keeps UCX's lanes.
//!
//! **Placement** ([`Placement`], without I/O): each frame contiguous, in order, freed in order
//! as the receiver counts them copied. A message's ring frames together take at most half
//! the ring, so they always fit once the receiver has caught up; the first frame placed in
//! an empty ring goes at its start (a connection that has one message in flight at a time
//! touches no more of the ring than its largest message).

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The control page's size (the count of frames copied out sits at its start).
pub(crate) const CTRL: usize = 4096;
/// The smallest ring a peer may offer, and the largest (a peer's offer costs this side only
/// address space, but a sane bound keeps a broken offer out).
pub(crate) const MIN_RING: u64 = crate::UCX_RING_MIN;
pub(crate) const MAX_RING: u64 = crate::UCX_RING_MAX;
/// Host frames larger than this travel through the ring (those UCX would send by
/// rendezvous: [`super::FIRST_MAX`]).
pub(crate) const RING_MIN: u64 = super::FIRST_MAX as u64;
/// A ring frame is written and announced in chunks of this many bytes (the last may be
/// shorter), so the receiver copies one chunk out while the sender writes the next.
pub(crate) const CHUNK: u64 = 256 << 10;

/// The chunks of a ring frame of `len` bytes: (offset within the frame, bytes).
pub(crate) fn chunks(len: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..len.div_ceil(CHUNK).max(1)).map(move |k| (k * CHUNK, CHUNK.min(len - k * CHUNK)))
}
/// The bytes of an offer.
pub(crate) const OFFER_LEN: usize = 33;

/// Which of a message's frames travel through a ring of `size` bytes: host frames larger than
/// [`RING_MIN`], if there are any and together they take at most half the ring (the rule both
/// sides apply to the header, so the receiver knows what comes through the ring). Indices
/// into the message's frames.
pub(crate) fn ring_frames(
    metas: impl Iterator<Item = crate::frame::FrameMeta>,
    size: u64,
) -> Option<Vec<usize>> {
    let mut picked = Vec::new();
    let mut bytes = 0u64;
    for (i, m) in metas.enumerate() {
        if !m.cuda && m.size > RING_MIN {
            picked.push(i);
            bytes = bytes.saturating_add(m.size);
        }
    }
    (!picked.is_empty() && bytes <= size / 2).then_some(picked)
}

/// Where frames go in a ring, freed in order (no I/O: the sender's side of the ring).
#[derive(Debug)]
pub(crate) struct Placement {
    size: u64,
    /// Regions (offset, length) placed and not yet counted copied out, oldest first.
    live: VecDeque<(u64, u64)>,
    /// Frames placed since the start.
    placed: u64,
    /// Frames counted copied out since the start.
    freed: u64,
}

/// The receiver counted more frames copied out than were placed, or fewer than before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadCount {
    pub(crate) count: u64,
    pub(crate) placed: u64,
}

impl Placement {
    pub(crate) fn new(size: u64) -> Placement {
        Placement {
            size,
            live: VecDeque::new(),
            placed: 0,
            freed: 0,
        }
    }

    /// Frees what the receiver has copied out: `count` frames since the start.
    pub(crate) fn copied_out(&mut self, count: u64) -> Result<(), BadCount> {
        if count < self.freed || count > self.placed {
            return Err(BadCount {
                count,
                placed: self.placed,
            });
        }
        for _ in self.freed..count {
            self.live.pop_front();
        }
        self.freed = count;
        Ok(())
    }

    /// Places frames of `lens` bytes, each contiguous, in order: their offsets, or `None`
    /// (nothing placed) if they do not all fit now.
    pub(crate) fn place(&mut self, lens: &[u64]) -> Option<Vec<u64>> {
        let mut at = Vec::with_capacity(lens.len());
        let (mut head, tail) = match (self.live.front(), self.live.back()) {
            (Some(&(t, _)), Some(&(h, l))) => (Some(h + l), t),
            _ => (None, 0),
        };
        for &len in lens {
            let off = match head {
                None => (len <= self.size).then_some(0)?,
                // In order, not wrapped: after the newest, or from the start up to the oldest.
                Some(h) if h > tail => {
                    if h + len <= self.size {
                        h
                    } else if len <= tail {
                        0
                    } else {
                        return None;
                    }
                }
                // Wrapped: between the newest and the oldest.
                Some(h) => (h + len <= tail).then_some(h)?,
            };
            head = Some(off + len);
            at.push(off);
        }
        for (&off, &len) in at.iter().zip(lens) {
            self.live.push_back((off, len));
        }
        self.placed += lens.len() as u64;
        Some(at)
    }

    /// Whether frames of `lens` bytes would fit now.
    pub(crate) fn fits(&self, lens: &[u64]) -> bool {
        let mut probe = Placement {
            size: self.size,
            live: self.live.clone(),
            placed: self.placed,
            freed: self.freed,
        };
        probe.place(lens).is_some()
    }
}

/// A shared mapping, unmapped on drop.
#[derive(Debug)]
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; every access through it goes
// through the methods below, which bound it by `len` (shared memory another process writes
// is read with raw copies, never through references that assume it does not change).
unsafe impl Send for Mapping {}
// SAFETY: as above; concurrent accesses are either to the control word (an atomic) or to
// disjoint regions the placement handed out.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(fd: &OwnedFd, offset: usize, len: usize, writable: bool) -> std::io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `len` bytes of an open file at `offset`; the
        // kernel picks the address. The result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the mapping past
        // its owner's life (copies in and out are done by then).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// What a sender offers: enough for the receiver to take the descriptor and check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Offer {
    pub(crate) pid: u32,
    pub(crate) fd: i32,
    pub(crate) ino: u64,
    pub(crate) dev: u64,
    /// The ring's bytes (the file is [`CTRL`] more).
    pub(crate) size: u64,
}

impl Offer {
    /// `[1, pid u32, fd i32, ino u64, dev u64, size u64]`, little-endian ([`OFFER_LEN`] bytes).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(OFFER_LEN);
        v.push(1);
        v.extend_from_slice(&self.pid.to_le_bytes());
        v.extend_from_slice(&self.fd.to_le_bytes());
        v.extend_from_slice(&self.ino.to_le_bytes());
        v.extend_from_slice(&self.dev.to_le_bytes());
        v.extend_from_slice(&self.size.to_le_bytes());
        v
    }

    /// An offer, `Ok(None)` for "no ring" (`[0]`), or `Err` for bytes that are neither.
    pub(crate) fn decode(b: &[u8]) -> Result<Option<Offer>, ()> {
        match b {
            [0] => Ok(None),
            [1, rest @ ..] if b.len() == OFFER_LEN => {
                let u64_at =
                    |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().unwrap_or([0; 8]));
                Ok(Some(Offer {
                    pid: u32::from_le_bytes(rest[0..4].try_into().unwrap_or([0; 4])),
                    fd: i32::from_le_bytes(rest[4..8].try_into().unwrap_or([0; 4])),
                    ino: u64_at(8),
                    dev: u64_at(16),
                    size: u64_at(24),
                }))
            }
            _ => Err(()),
        }
    }
}

/// The sender's ring: its mapping (control page and ring, writable), and where frames go.
#[derive(Debug)]
pub(crate) struct RingOut {
    map: Mapping,
    size: u64,
    placement: std::sync::Mutex<Placement>,
    /// The file, kept until the peer has taken it (dropped after the exchange).
    fd: std::sync::Mutex<Option<OwnedFd>>,
    offer: Offer,
}

fn stat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a whole `stat` into the buffer on success (checked).
    if unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: initialised by the successful fstat above.
    Ok(unsafe { st.assume_init() })
}

fn check(r: libc::c_int) -> std::io::Result<libc::c_int> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// The seals a ring must carry: its size can change no more.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

impl RingOut {
    /// A new ring of `size` bytes (sparse: pages are allocated as frames first touch them).
    pub(crate) fn create(size: u64) -> std::io::Result<RingOut> {
        let len = CTRL + usize::try_from(size).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        // SAFETY: a NUL-terminated name and flags; the result is checked.
        let raw = check(unsafe {
            libc::memfd_create(
                c"ucx-stack-ring".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        })?;
        // SAFETY: `raw` is a descriptor memfd_create just opened, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain calls on the descriptor just made; results checked.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) })?;
        let map = Mapping::map(&fd, 0, len, true)?;
        let st = stat(&fd)?;
        let offer = Offer {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
            ino: st.st_ino,
            dev: st.st_dev,
            size,
        };
        Ok(RingOut {
            map,
            size,
            placement: std::sync::Mutex::new(Placement::new(size)),
            fd: std::sync::Mutex::new(Some(fd)),
            offer,
        })
    }

    pub(crate) fn offer(&self) -> Offer {
        self.offer
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Closes this side's descriptor (the peer took its own, or declined).
    pub(crate) fn offered(&self) {
        self.fd.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn copied_out(&self) -> &AtomicU64 {
        // SAFETY: the control page is mapped (read-write) for the life of `self`, page-aligned;
        // its first 8 bytes are only ever accessed atomically, by both processes.
        unsafe { &*(self.map.ptr as *const AtomicU64) }
    }

    /// Frees what the receiver has copied out, then places frames of `lens` bytes: their
    /// offsets, `Ok(None)` if they do not fit yet, `Err` if the receiver's count is not one.
    pub(crate) fn place(&self, lens: &[u64]) -> Result<Option<Vec<u64>>, BadCount> {
        let mut p = self.placement.lock().unwrap_or_else(|e| e.into_inner());
        p.copied_out(self.copied_out().load(Ordering::Acquire))?;
        Ok(p.place(lens))
    }

    /// Whether frames of `lens` bytes fit now (after freeing what was copied out).
    pub(crate) fn fits(&self, lens: &[u64]) -> Result<bool, BadCount> {
        let mut p = self.placement.lock().unwrap_or_else(|e| e.into_inner());
        p.copied_out(self.copied_out().load(Ordering::Acquire))?;
        Ok(p.fits(lens))
    }

    /// Copies `bytes` into the ring at `off` (a region [`Self::place`] handed out).
    pub(crate) fn write(&self, off: u64, bytes: &[u8]) {
        let off = off as usize;
        assert!(
            off + bytes.len() <= self.size as usize,
            "a region the ring placed"
        );
        // SAFETY: in bounds of the ring (asserted), which starts CTRL bytes into the mapping;
        // the region is this frame's alone until the receiver counts it copied out, and a
        // sender's bytes never overlap the ring.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.ptr.add(CTRL + off), bytes.len())
        };
    }

    /// Makes what was written visible before the plan that names it is sent.
    pub(crate) fn publish(&self) {
        std::sync::atomic::fence(Ordering::Release);
    }
}

/// Why an offered ring was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Decline {
    #[error("the ring's size, {0} bytes, is out of bounds")]
    Size(u64),
    #[error("the sender's descriptor could not be taken: {0}")]
    Take(std::io::Error),
    #[error("the descriptor taken is not the file offered (another host or pid namespace?)")]
    NotOffered,
    #[error("the file is not sealed against resizing")]
    Unsealed,
    #[error("the ring could not be mapped: {0}")]
    Map(std::io::Error),
}

/// The receiver's view of a peer's ring: the control page (writable: the count of frames
/// copied out) and the ring (read-only).
#[derive(Debug)]
pub(crate) struct RingIn {
    ctrl: Mapping,
    ring: Mapping,
    size: u64,
    /// Frames copied out since the start (what the control page says, kept here too).
    count: AtomicU64,
}

impl RingIn {
    /// Takes the ring `offer` describes from the offering process.
    pub(crate) fn take(offer: &Offer) -> Result<RingIn, Decline> {
        if !(MIN_RING..=MAX_RING).contains(&offer.size) {
            return Err(Decline::Size(offer.size));
        }
        let pid = libc::pid_t::try_from(offer.pid).map_err(|_| Decline::NotOffered)?;
        // SAFETY: pidfd_open(pid, 0) returns a new descriptor or -1 (checked).
        let pidfd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as libc::c_int)
            .map_err(Decline::Take)?;
        // SAFETY: a descriptor just opened, owned here.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
        // SAFETY: pidfd_getfd(pidfd, fd, 0) duplicates the target's descriptor into this
        // process, or returns -1 (checked).
        let raw = check(unsafe {
            libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), offer.fd, 0) as libc::c_int
        })
        .map_err(Decline::Take)?;
        // SAFETY: a descriptor just duplicated into this process, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let st = stat(&fd).map_err(Decline::Take)?;
        let len = CTRL as u64 + offer.size;
        if st.st_ino != offer.ino || st.st_dev != offer.dev || st.st_size as u64 != len {
            return Err(Decline::NotOffered);
        }
        // SAFETY: F_GET_SEALS on an open descriptor (-1 for files that cannot be sealed).
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let fixed = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & fixed != fixed {
            return Err(Decline::Unsealed);
        }
        let ctrl = Mapping::map(&fd, 0, CTRL, true).map_err(Decline::Map)?;
        let ring = Mapping::map(&fd, CTRL, offer.size as usize, false).map_err(Decline::Map)?;
        Ok(RingIn {
            ctrl,
            ring,
            size: offer.size,
            count: AtomicU64::new(0),
        })
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// Appends the `len` bytes at `off` of the ring to `buf`, or says the region is outside
    /// the ring.
    pub(crate) fn read(&self, off: u64, len: u64, buf: &mut Vec<u8>) -> Result<(), ()> {
        if !matches!(off.checked_add(len), Some(end) if end <= self.size) {
            return Err(());
        }
        std::sync::atomic::fence(Ordering::Acquire);
        let len = len as usize;
        buf.reserve(len);
        let at = buf.len();
        // SAFETY: the region is inside the ring's mapping (checked above), which lives as long
        // as `self`; `buf` has room for `len` more bytes (reserved), which the copy fills
        // before the length covers them. The sender does not write a region between placing
        // it and this side counting it copied out; were it to (a broken peer), these would be
        // wrong bytes, never memory outside the two buffers.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ring.ptr.add(off as usize),
                buf.as_mut_ptr().add(at),
                len,
            );
            buf.set_len(at + len);
        }
        Ok(())
    }

    /// Counts `n` more frames copied out (the sender may reuse their regions).
    pub(crate) fn copied(&self, n: u64) {
        let count = self.count.fetch_add(n, Ordering::Relaxed) + n;
        // SAFETY: the control page is mapped read-write for the life of `self`, page-aligned;
        // its first 8 bytes are only accessed atomically.
        let word = unsafe { &*(self.ctrl.ptr as *const AtomicU64) };
        word.store(count, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Placed regions never overlap a live one, and a message of at most half the ring
    /// always fits once the receiver caught up.
    #[test]
    fn placement_keeps_live_regions_apart() {
        let size = 1000u64;
        let mut p = Placement::new(size);
        let mut live: VecDeque<(u64, u64)> = VecDeque::new();
        let mut seed = 7u64;
        let mut next = |m: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let (mut placed, mut freed) = (0u64, 0u64);
        for _ in 0..20_000 {
            if next(3) == 0 && placed > freed {
                let n = 1 + next(placed - freed);
                freed += n;
                p.copied_out(freed).unwrap();
                for _ in 0..n {
                    live.pop_front();
                }
                continue;
            }
            let k = 1 + next(3) as usize;
            let lens: Vec<u64> = (0..k).map(|_| 1 + next(size / 2 / k as u64)).collect();
            let Some(at) = p.place(&lens) else {
                // It fits once everything is copied out.
                freed = placed;
                p.copied_out(freed).unwrap();
                live.clear();
                assert!(p.place(&lens).is_some(), "{lens:?} fits an empty ring");
                placed += lens.len() as u64;
                freed = placed;
                p.copied_out(freed).unwrap();
                continue;
            };
            for (&o, &l) in at.iter().zip(&lens) {
                assert!(o + l <= size);
                for &(lo, ll) in &live {
                    assert!(
                        o + l <= lo || lo + ll <= o,
                        "[{o},{}) overlaps [{lo},{})",
                        o + l,
                        lo + ll
                    );
                }
                live.push_back((o, l));
            }
            placed += lens.len() as u64;
        }
        assert_eq!(
            p.copied_out(placed + 1),
            Err(BadCount {
                count: placed + 1,
                placed
            })
        );
        assert!(p.copied_out(freed.saturating_sub(1)).is_err() || freed == 0);
    }

    #[test]
    fn an_empty_ring_starts_at_its_start() {
        let mut p = Placement::new(100);
        assert_eq!(p.place(&[60]), Some(vec![0]));
        assert_eq!(p.place(&[50]), None);
        assert_eq!(p.place(&[40]), Some(vec![60]));
        p.copied_out(1).unwrap();
        assert_eq!(p.place(&[60]), Some(vec![0]));
        p.copied_out(3).unwrap();
        assert_eq!(p.place(&[10, 10]), Some(vec![0, 10]));
    }

    #[test]
    fn which_frames_take_the_ring() {
        use crate::frame::FrameMeta;
        let m = |size, cuda| FrameMeta { size, cuda };
        let big = RING_MIN + 1;
        assert_eq!(
            ring_frames(
                [m(10, false), m(big, false), m(big, true)].into_iter(),
                4 * big
            ),
            Some(vec![1])
        );
        assert_eq!(ring_frames([m(RING_MIN, false)].into_iter(), 1 << 30), None);
        assert_eq!(
            ring_frames([m(big, false), m(big, false)].into_iter(), 4 * big - 1),
            None
        );
        assert_eq!(
            ring_frames([m(big, false), m(big, false)].into_iter(), 4 * big),
            Some(vec![0, 1])
        );
    }

    #[test]
    fn offers_round_trip_and_refuse_noise() {
        let o = Offer {
            pid: 7,
            fd: 9,
            ino: 11,
            dev: 13,
            size: 1 << 24,
        };
        assert_eq!(Offer::decode(&o.encode()), Ok(Some(o)));
        assert_eq!(Offer::decode(&[0]), Ok(None));
        assert!(Offer::decode(&[1, 2, 3]).is_err());
        assert!(Offer::decode(&[]).is_err());
    }

    /// A ring taken from this very process (pidfd_getfd on oneself): bytes written by one
    /// side are read by the other, the count reaches the sender, and what is not a sealed
    /// ring is declined.
    #[test]
    fn a_ring_carries_bytes_between_its_two_sides() {
        let out = RingOut::create(MIN_RING).unwrap();
        // Fails on kernels before 5.6 or under a seccomp filter without pidfd_getfd, where
        // the lane is off (connections decline it and keep UCX's lanes).
        let inn = RingIn::take(&out.offer())
            .unwrap_or_else(|e| panic!("taking a ring from this process: {e}"));
        out.offered();
        let at = out.place(&[5, 3]).unwrap().unwrap();
        out.write(at[0], b"hello");
        out.write(at[1], b"abc");
        out.publish();
        let mut buf = Vec::new();
        inn.read(at[0], 5, &mut buf).unwrap();
        assert_eq!(buf, b"hello");
        inn.read(at[1], 3, &mut buf).unwrap();
        assert_eq!(buf, b"helloabc", "appended");
        assert!(inn.read(MIN_RING - 2, 3, &mut buf).is_err());
        assert!(inn.read(u64::MAX, 2, &mut buf).is_err());
        assert!(!out.fits(&[MIN_RING]).unwrap());
        inn.copied(2);
        assert!(out.fits(&[MIN_RING]).unwrap());
        // Counting more than was placed is the peer breaking the ring.
        inn.copied(1);
        assert!(out.place(&[1]).is_err());

        // Wrong file, wrong size, a file without seals: declined.
        let other = RingOut::create(MIN_RING).unwrap();
        let mut wrong = other.offer();
        wrong.ino ^= 1;
        assert!(matches!(RingIn::take(&wrong), Err(Decline::NotOffered)));
        let mut small = other.offer();
        small.size = 4096;
        assert!(matches!(RingIn::take(&small), Err(Decline::Size(4096))));
        let mut resized = other.offer();
        resized.size = 2 * MIN_RING;
        assert!(matches!(RingIn::take(&resized), Err(Decline::NotOffered)));
        // SAFETY: a plain memfd, no seals, owned here.
        let raw = unsafe { libc::memfd_create(c"plain".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: just opened, owned here.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: on the descriptor above.
        let sized = unsafe { libc::ftruncate(raw, (CTRL as u64 + MIN_RING) as libc::off_t) };
        assert_eq!(sized, 0);
        let st = stat(&plain).unwrap();
        let unsealed = Offer {
            pid: std::process::id(),
            fd: raw,
            ino: st.st_ino,
            dev: st.st_dev,
            size: MIN_RING,
        };
        assert!(matches!(RingIn::take(&unsealed), Err(Decline::Unsealed)));
        // Another process's descriptor numbers are not this one's: a pid that is not the
        // offerer's finds some other file, or none.
        let mut elsewhere = other.offer();
        elsewhere.pid = 1;
        assert!(RingIn::take(&elsewhere).is_err());
    }
}
