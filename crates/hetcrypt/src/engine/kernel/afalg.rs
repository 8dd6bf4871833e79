//! The AF_ALG socket interface: bind a transform, key it, run requests on an operation socket.
//!
//! The user-space API of the Linux crypto API (Documentation/crypto/userspace-if.rst):
//! a *transform* socket is `bind`-ed to (type, algorithm name) and keyed with
//! `setsockopt(ALG_SET_KEY)`; `accept` on it gives an *operation* socket; one request is
//! `sendmsg` (control messages: operation, IV, AAD length; data: the input) followed by
//! `read` of the output; or, for large inputs, `sendmsg` of the control messages alone
//! and the input moved in by `vmsplice` + `splice` through a [`SplicePipe`], which the
//! kernel takes without copying it. Everything here is a thin, typed wrapper over those calls
//! through `nix`; what a request means (chunking, padding, chaining) is the engine's.

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, SpliceFFlags};
use nix::sys::socket::{self, sockopt, AddressFamily, AlgAddr, SockFlag};

/// An AF_ALG socket type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum AlgType {
    /// Symmetric ciphers (`cbc(aes)`, `ctr(aes)`).
    Skcipher,
    /// Authenticated encryption (`gcm(aes)`).
    Aead,
}

impl AlgType {
    /// The name `bind` takes and `/proc/crypto` prints as `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            AlgType::Skcipher => "skcipher",
            AlgType::Aead => "aead",
        }
    }
}

/// Longest algorithm or driver name AF_ALG accepts: `struct sockaddr_alg` has
/// `salg_name[64]`, NUL-terminated.
pub(crate) const ALG_NAME_MAX: usize = 63;

/// A failed system call: which one, and the errno.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SysError {
    /// The call, in words (`"bind"`, `"read"`, ...).
    pub call: &'static str,
    /// What the kernel said.
    pub errno: Errno,
}

impl std::fmt::Display for SysError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} ({:?})", self.call, self.errno.desc(), self.errno)
    }
}

/// Tags an errno with the call that returned it.
fn at(call: &'static str) -> impl Fn(Errno) -> SysError {
    move |errno| SysError { call, errno }
}

/// Whether the running kernel offers AF_ALG at all: a fresh socket, or the errno
/// (`EAFNOSUPPORT` where AF_ALG is not built, as on our host).
pub(crate) fn alg_socket() -> Result<OwnedFd, SysError> {
    socket::socket(
        AddressFamily::Alg,
        socket::SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(at("socket(AF_ALG)"))
}

/// A transform socket: one algorithm instance, keyed once.
#[derive(Debug)]
pub(crate) struct Tfm {
    fd: OwnedFd,
}

impl Tfm {
    /// Binds a new transform to `name` (a generic algorithm name such as `cbc(aes)`, or
    /// a driver name such as `virtio_crypto_aes_cbc`) of type `ty`. `ENOENT`: no
    /// driver answers to that name with that type.
    pub fn bind(ty: AlgType, name: &str) -> Result<Tfm, SysError> {
        if name.len() > ALG_NAME_MAX || name.as_bytes().contains(&0) {
            // AlgAddr::new would panic on an over-long name; the kernel would say this.
            return Err(SysError {
                call: "bind",
                errno: Errno::ENAMETOOLONG,
            });
        }
        let fd = alg_socket()?;
        socket::bind(fd.as_raw_fd(), &AlgAddr::new(ty.as_str(), name)).map_err(at("bind"))?;
        Ok(Tfm { fd })
    }

    /// Sets the key. The bytes go straight from the caller's buffer into the kernel.
    pub fn set_key(&self, key: &[u8]) -> Result<(), SysError> {
        socket::setsockopt(&self.fd, sockopt::AlgSetKey::default(), &key)
            .map_err(at("setsockopt(ALG_SET_KEY)"))
    }

    /// Sets the AEAD tag length (before `accept`).
    pub fn set_aead_tag_len(&self, len: usize) -> Result<(), SysError> {
        socket::setsockopt(&self.fd, sockopt::AlgSetAeadAuthSize, &len)
            .map_err(at("setsockopt(ALG_SET_AEAD_AUTHSIZE)"))
    }

    /// Gives up the socket (to keep it open elsewhere).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Opens an operation socket on this (keyed) transform.
    pub fn accept(&self) -> Result<OpSocket, SysError> {
        let raw =
            socket::accept4(self.fd.as_raw_fd(), SockFlag::SOCK_CLOEXEC).map_err(at("accept"))?;
        // SAFETY: accept4 just returned this descriptor; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(OpSocket { fd })
    }
}

/// Which way a request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    /// `ALG_OP_ENCRYPT`.
    Encrypt,
    /// `ALG_OP_DECRYPT`.
    Decrypt,
}

/// An operation socket: requests are sent and their results read here, one at a time.
#[derive(Debug)]
pub(crate) struct OpSocket {
    fd: OwnedFd,
}

impl OpSocket {
    /// Gives up the socket (to keep it open elsewhere).
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Sends one whole request (never `MSG_MORE`): operation, IV, AAD length (AEAD),
    /// and the input, gathered from `input`. The caller keeps the request within
    /// what [`OpSocket::limits`] allows in, so this never waits for buffer space that only a
    /// `read` could free.
    pub fn send(
        &self,
        op: Op,
        iv: &[u8],
        assoclen: Option<u32>,
        input: &[IoSlice<'_>],
    ) -> Result<(), SysError> {
        let want: usize = input.iter().map(|s| s.len()).sum();
        let sent = self.send_request(op, iv, assoclen, input, 0, "sendmsg")?;
        if sent != want {
            // Only a signal can cut a send short; the request is then half-queued and
            // the socket unusable.
            return Err(SysError {
                call: "sendmsg (short)",
                errno: Errno::EIO,
            });
        }
        Ok(())
    }

    /// As [`OpSocket::send`], but the input is not copied: the control messages go in a
    /// `sendmsg` of their own (`MSG_MORE`), then the input's pages are `vmsplice`d into
    /// `pipe` and `splice`d from it into the socket, which keeps references to them
    /// (`af_alg_sendpage`) until the request's `read` returns. The caller checks
    /// [`SplicePipe::fits`] first, and must not touch `input` before that `read`.
    pub fn send_spliced(
        &self,
        op: Op,
        iv: &[u8],
        input: &[IoSlice<'_>],
        pipe: &SplicePipe,
    ) -> Result<(), SysError> {
        // The request goes on: its data follows through the pipe.
        self.send_request(op, iv, None, &[], nix::libc::MSG_MORE, "sendmsg (control)")?;
        pipe.feed(input, &self.fd)
    }

    /// One `sendmsg` of a request's control messages (built by [`Cmsgs::new`] on the
    /// stack) and `input`, with `flags`; the bytes of `input` it took. Called straight
    /// rather than through `nix::sys::socket::sendmsg`, which allocates a buffer for
    /// the control messages and this function's vector of them on every request.
    fn send_request(
        &self,
        op: Op,
        iv: &[u8],
        assoclen: Option<u32>,
        input: &[IoSlice<'_>],
        flags: nix::libc::c_int,
        call: &'static str,
    ) -> Result<usize, SysError> {
        let mut cmsgs = Cmsgs::new(op, iv, assoclen).map_err(at(call))?;
        // SAFETY: an all-zero `msghdr` is valid (null pointers, zero lengths).
        let mut msg: nix::libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `iovec` (std's guarantee on Unix), and
        // sendmsg only reads the vector and the buffers it points to.
        msg.msg_iov = input.as_ptr().cast_mut().cast();
        msg.msg_iovlen = input.len() as _;
        msg.msg_control = cmsgs.buf.0.as_mut_ptr().cast();
        msg.msg_controllen = cmsgs.len as _;
        // SAFETY: `msg` points at `input` and `cmsgs`, both alive and unmoved for the
        // call; the kernel only reads them.
        let n = unsafe { nix::libc::sendmsg(self.fd.as_raw_fd(), &msg, flags) };
        usize::try_from(n).map_err(|_| at(call)(Errno::last()))
    }

    /// Reads the request's output into `out` until every slice is full. A read cut
    /// short by a signal is resumed (it issues no new request).
    pub fn recv_exact(&self, mut out: &mut [IoSliceMut<'_>]) -> Result<(), SysError> {
        // Skip leading empty slices, so that `out.is_empty()` means "all filled".
        IoSliceMut::advance_slices(&mut out, 0);
        while !out.is_empty() {
            match nix::sys::uio::readv(&self.fd, out) {
                Ok(0) => {
                    return Err(SysError {
                        call: "read (no output)",
                        errno: Errno::EIO,
                    })
                }
                Ok(n) => IoSliceMut::advance_slices(&mut out, n),
                Err(Errno::EINTR) => {}
                Err(e) => return Err(at("read")(e)),
            }
        }
        Ok(())
    }

    /// Reads the request's output into `out`, which may be uninitialised, until it is
    /// full: on success every byte of it has been written. (Zeroing an output buffer
    /// first costs, in an emulated guest, a good part of a small request.) A read cut
    /// short by a signal is resumed.
    pub fn recv_into(&self, out: &mut [MaybeUninit<u8>]) -> Result<(), SysError> {
        let mut done = 0;
        while done < out.len() {
            let rest = &mut out[done..];
            // SAFETY: read(2) writes at most `rest.len()` bytes to `rest`, memory this
            // function borrows exclusively; writing to uninitialised bytes is what
            // `MaybeUninit` allows.
            let n = unsafe {
                nix::libc::read(self.fd.as_raw_fd(), rest.as_mut_ptr().cast(), rest.len())
            };
            match n {
                0 => {
                    return Err(SysError {
                        call: "read (no output)",
                        errno: Errno::EIO,
                    })
                }
                n if n > 0 => done += n.unsigned_abs(),
                _ => match Errno::last() {
                    Errno::EINTR => {}
                    e => return Err(at("read")(e)),
                },
            }
        }
        Ok(())
    }

    /// Runs a request that outputs nothing (GCM decryption of empty AAD and
    /// ciphertext: only the tag is checked). The kernel runs a request only when
    /// `read` offers it room, so one spare byte is offered; it stays unwritten.
    pub fn recv_nothing(&self) -> Result<(), SysError> {
        let mut spare = [0u8; 1];
        loop {
            match nix::unistd::read(&self.fd, &mut spare) {
                Ok(0) => return Ok(()),
                Ok(_) => {
                    return Err(SysError {
                        call: "read (unexpected output)",
                        errno: Errno::EIO,
                    })
                }
                Err(Errno::EINTR) => {}
                Err(e) => return Err(at("read")(e)),
            }
        }
    }

    /// Most bytes one request may carry in, and most it may return, on this socket.
    ///
    /// AF_ALG copies the input into pages charged to the socket's send buffer and
    /// blocks `sendmsg` while less than a page of it is free; only `read` frees it. The
    /// output pages are charged to the receive buffer the same way. So a request must
    /// fit in `SO_SNDBUF` / `SO_RCVBUF` rounded down to pages; one page less leaves
    /// room for the kernel's per-page accounting.
    pub fn limits(&self) -> Result<(usize, usize), SysError> {
        let page = page_size();
        let fit = |buf: usize| (buf & !(page - 1)).saturating_sub(page);
        let snd =
            socket::getsockopt(&self.fd, sockopt::SndBuf).map_err(at("getsockopt(SO_SNDBUF)"))?;
        let rcv =
            socket::getsockopt(&self.fd, sockopt::RcvBuf).map_err(at("getsockopt(SO_RCVBUF)"))?;
        Ok((fit(snd), fit(rcv)))
    }
}

/// Longest IV a request carries: AES's block (CBC, CTR); GCM's nonce is 12 bytes.
const IV_MAX: usize = 16;

/// Room for a request's control messages: the operation and the AEAD's associated
/// data length (a `u32` each) and the IV (`struct af_alg_iv`: a `u32` length, then the
/// IV), each in its `CMSG_SPACE`.
const CMSG_ROOM: usize = {
    let word = std::mem::size_of::<u32>() as u32;
    // SAFETY: CMSG_SPACE is arithmetic on its argument; it touches no memory.
    unsafe {
        2 * nix::libc::CMSG_SPACE(word) as usize
            + nix::libc::CMSG_SPACE(word + IV_MAX as u32) as usize
    }
};

/// A control-message buffer aligned as `cmsghdr` wants (its length is a `size_t`).
#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_ROOM]);

/// One request's control messages (operation, IV, and for an AEAD the associated
/// data length), laid out as `sendmsg` takes them, on the stack.
struct Cmsgs {
    buf: CmsgBuf,
    /// Bytes of `buf` in use.
    len: usize,
}

impl Cmsgs {
    /// The control messages of a request; `EINVAL` for an IV over [`IV_MAX`] bytes.
    fn new(op: Op, iv: &[u8], assoclen: Option<u32>) -> Result<Cmsgs, Errno> {
        if iv.len() > IV_MAX {
            return Err(Errno::EINVAL);
        }
        let op = match op {
            Op::Encrypt => nix::libc::ALG_OP_ENCRYPT,
            Op::Decrypt => nix::libc::ALG_OP_DECRYPT,
        } as u32;
        let mut iv_data = [0u8; 4 + IV_MAX];
        iv_data[..4].copy_from_slice(&(iv.len() as u32).to_ne_bytes());
        iv_data[4..4 + iv.len()].copy_from_slice(iv);
        let op_data = op.to_ne_bytes();
        let assoc_data = assoclen.unwrap_or(0).to_ne_bytes();
        let all: [(nix::libc::c_int, &[u8]); 3] = [
            (nix::libc::ALG_SET_OP, &op_data),
            (nix::libc::ALG_SET_IV, &iv_data[..4 + iv.len()]),
            (nix::libc::ALG_SET_AEAD_ASSOCLEN, &assoc_data),
        ];
        let used = if assoclen.is_some() { 3 } else { 2 };
        let mut c = Cmsgs {
            buf: CmsgBuf([0; CMSG_ROOM]),
            len: 0,
        };
        for (ty, data) in &all[..used] {
            // SAFETY: CMSG_SPACE and CMSG_LEN are arithmetic only. The header and data
            // are written inside `buf`: `len` + CMSG_SPACE(data) <= CMSG_ROOM by
            // construction of CMSG_ROOM (at most the three messages it counts, the IV
            // at most IV_MAX bytes), `buf` is aligned for `cmsghdr`, and each
            // message starts at a multiple of CMSG_ALIGN's unit since every
            // CMSG_SPACE is one; CMSG_DATA points just past the header.
            unsafe {
                let space = nix::libc::CMSG_SPACE(data.len() as u32) as usize;
                let hdr = c.buf.0.as_mut_ptr().add(c.len).cast::<nix::libc::cmsghdr>();
                (*hdr).cmsg_len = nix::libc::CMSG_LEN(data.len() as u32) as _;
                (*hdr).cmsg_level = nix::libc::SOL_ALG;
                (*hdr).cmsg_type = *ty;
                std::ptr::copy_nonoverlapping(data.as_ptr(), nix::libc::CMSG_DATA(hdr), data.len());
                c.len += space;
            }
        }
        Ok(c)
    }
}

/// A pipe through which [`OpSocket::send_spliced`] hands the kernel a request's input
/// pages instead of a copy of them. One per lane; empty between requests.
#[derive(Debug)]
pub(crate) struct SplicePipe {
    read: OwnedFd,
    write: OwnedFd,
    /// Pages it holds at once (one slot per page, whatever part of the page is used).
    slots: usize,
}

impl SplicePipe {
    /// A pipe with room for the pages of an input of `bytes` bytes wherever it lies in
    /// memory: each of up to two slices (the body and the padding block) may start and
    /// end within a page, so two pages more per slice than `bytes` fills.
    pub fn new(bytes: usize) -> Result<Self, SysError> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(at("pipe2"))?;
        let page = page_size();
        let want = bytes.div_ceil(page) * page + 4 * page;
        let want = i32::try_from(want).unwrap_or(i32::MAX);
        // A smaller pipe (the limit is `fs.pipe-max-size`, 1 MiB by default) still
        // serves the inputs that fit in it; the rest are sent by copy.
        let size = nix::fcntl::fcntl(&write, FcntlArg::F_SETPIPE_SZ(want))
            .or_else(|_| nix::fcntl::fcntl(&write, FcntlArg::F_GETPIPE_SZ))
            .map_err(at("fcntl(F_SETPIPE_SZ)"))?;
        Ok(SplicePipe {
            read,
            write,
            slots: usize::try_from(size).unwrap_or(0) / page,
        })
    }

    /// Moves `input` into `to` through the pipe: its pages `vmsplice`d in (referenced,
    /// not copied), then `splice`d out. Into an AF_ALG socket every page but the
    /// pipe's last goes with "more to come" (the kernel's `MSG_SENDPAGE_NOTLAST`), so
    /// the request ends with its last byte, whether one splice moves it all or several
    /// do. The caller checks [`SplicePipe::fits`] first: then one `vmsplice` takes it
    /// all, and a short one (which would leave a request half-queued) is an error.
    pub fn feed(&self, input: &[IoSlice<'_>], to: &impl AsFd) -> Result<(), SysError> {
        let want: usize = input.iter().map(|s| s.len()).sum();
        let queued = nix::fcntl::vmsplice(&self.write, input, SpliceFFlags::empty())
            .map_err(at("vmsplice"))?;
        if queued != want {
            return Err(SysError {
                call: "vmsplice (short)",
                errno: Errno::EIO,
            });
        }
        let mut left = want;
        while left > 0 {
            match nix::fcntl::splice(&self.read, None, to, None, left, SpliceFFlags::empty()) {
                Ok(0) => {
                    return Err(SysError {
                        call: "splice (nothing moved)",
                        errno: Errno::EIO,
                    })
                }
                Ok(n) => left -= n,
                Err(Errno::EINTR) => {}
                Err(e) => return Err(at("splice")(e)),
            }
        }
        Ok(())
    }

    /// Whether `input` fits in the pipe at once: one slot per page each slice touches.
    pub fn fits(&self, input: &[IoSlice<'_>]) -> bool {
        pages_touched(input, page_size()) <= self.slots
    }
}

/// The pages of size `page` that the bytes of `input` lie in, counted per slice.
fn pages_touched(input: &[IoSlice<'_>], page: usize) -> usize {
    input
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| {
            let start = s.as_ptr() as usize;
            let end = start + s.len();
            end.div_ceil(page) - start / page
        })
        .sum()
}

/// The page size, in bytes (4 KiB where `sysconf` cannot tell).
fn page_size() -> usize {
    /// x86-64's page, the fallback.
    const DEFAULT_PAGE: usize = 4096;
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .and_then(|p| usize::try_from(p).ok())
        .filter(|p| p.is_power_of_two())
        .unwrap_or(DEFAULT_PAGE)
}

/// A datagram socket connected to itself: what is sent to it is read back from it.
/// (AF_UNIX accepts and drops control messages of other levels than SOL_SOCKET,
/// once the kernel has checked that each lies within the buffer.)
#[cfg(test)]
pub(crate) fn echo_socket() -> OpSocket {
    use nix::sys::socket::{bind, connect, UnixAddr};
    let fd = unix_datagram();
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("hetcrypt-afalg-echo-{}-{n}", std::process::id());
    let addr = UnixAddr::new_abstract(name.as_bytes()).expect("address");
    bind(fd.as_raw_fd(), &addr).expect("bind");
    connect(fd.as_raw_fd(), &addr).expect("connect");
    OpSocket { fd }
}

/// A transform that is no transform (a plain socket), to stand beside an
/// [`echo_socket`] in a test's context.
#[cfg(test)]
pub(crate) fn no_tfm() -> Tfm {
    Tfm {
        fd: unix_datagram(),
    }
}

/// An unbound AF_UNIX datagram socket, for the test sockets above.
#[cfg(test)]
fn unix_datagram() -> OwnedFd {
    use nix::sys::socket::{socket, SockType};
    socket(
        AddressFamily::Unix,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::libc::{ALG_SET_AEAD_ASSOCLEN, ALG_SET_IV, ALG_SET_OP, SOL_ALG};

    #[test]
    fn pages_are_counted_per_slice_wherever_it_starts() {
        let page = 4096;
        let buf = vec![0u8; 4 * page];
        // An aligned start is not guaranteed: find the first page boundary.
        let skip = (page - buf.as_ptr() as usize % page) % page;
        let at = |from: usize, len: usize| IoSlice::new(&buf[skip + from..skip + from + len]);
        assert_eq!(pages_touched(&[at(0, page)], page), 1);
        assert_eq!(pages_touched(&[at(1, page)], page), 2);
        assert_eq!(pages_touched(&[at(page - 1, 2)], page), 2);
        assert_eq!(pages_touched(&[at(0, 1), at(page, 1)], page), 2);
        assert_eq!(pages_touched(&[at(0, 0)], page), 0);
    }

    #[test]
    fn a_pipe_holds_a_whole_request_and_feeds_it_intact_twice() {
        let pipe = SplicePipe::new(64 * 1024).expect("pipe");
        let body: Vec<u8> = (0..64 * 1024 - 16).map(|i| (i % 251) as u8).collect();
        let tail = [0xAB_u8; 16];
        let input = [IoSlice::new(&body), IoSlice::new(&tail)];
        assert!(pipe.fits(&input), "{} slots", pipe.slots);
        let (mut rx, tx) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        // Big enough socket buffers for a whole request at once.
        nix::sys::socket::setsockopt(&tx, sockopt::SndBuf, &(1 << 20)).expect("sndbuf");
        nix::sys::socket::setsockopt(&rx, sockopt::RcvBuf, &(1 << 20)).expect("rcvbuf");
        for _ in 0..2 {
            let reader = {
                let mut rx = rx.try_clone().expect("clone");
                std::thread::spawn(move || {
                    let mut got = vec![0u8; 64 * 1024];
                    std::io::Read::read_exact(&mut rx, &mut got).expect("read");
                    got
                })
            };
            pipe.feed(&input, &tx).expect("feed");
            let got = reader.join().expect("reader");
            assert_eq!(&got[..body.len()], &body[..]);
            assert_eq!(&got[body.len()..], &tail[..]);
        }
        // Nothing is left behind in the pipe or the socket.
        rx.set_nonblocking(true).expect("nonblocking");
        let mut more = [0u8; 1];
        assert!(std::io::Read::read(&mut rx, &mut more).is_err());
    }

    #[test]
    fn an_input_with_more_pages_than_slots_does_not_fit() {
        let pipe = SplicePipe::new(4096).expect("pipe");
        let big = vec![0u8; (pipe.slots + 1) * 4096];
        assert!(!pipe.fits(&[IoSlice::new(&big)]));
    }

    /// The control messages as the kernel walks them: (level, type, data) each.
    fn parsed(c: &mut Cmsgs) -> Vec<(i32, i32, Vec<u8>)> {
        // SAFETY: as in `send_request`: an all-zero msghdr, then pointing it at `c`.
        let mut msg: nix::libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_control = c.buf.0.as_mut_ptr().cast();
        msg.msg_controllen = c.len as _;
        let mut out = Vec::new();
        // SAFETY: the libc macros walk `c.buf` within `msg_controllen`, each header's
        // `cmsg_len` bounding its data.
        unsafe {
            let mut h = nix::libc::CMSG_FIRSTHDR(&msg);
            while !h.is_null() {
                let data_len = (*h).cmsg_len as usize - nix::libc::CMSG_LEN(0) as usize;
                let data = std::slice::from_raw_parts(nix::libc::CMSG_DATA(h), data_len);
                out.push(((*h).cmsg_level, (*h).cmsg_type, data.to_vec()));
                h = nix::libc::CMSG_NXTHDR(&msg, h);
            }
        }
        out
    }

    #[test]
    fn control_messages_carry_the_operation_the_iv_and_the_aad_length() {
        let iv: Vec<u8> = (1..=16).collect();
        let mut c = Cmsgs::new(Op::Decrypt, &iv, None).expect("cmsgs");
        let mut want_iv = 16u32.to_ne_bytes().to_vec();
        want_iv.extend_from_slice(&iv);
        let op = |v: i32| (v as u32).to_ne_bytes().to_vec();
        assert_eq!(
            parsed(&mut c),
            vec![
                (SOL_ALG, ALG_SET_OP, op(nix::libc::ALG_OP_DECRYPT)),
                (SOL_ALG, ALG_SET_IV, want_iv),
            ]
        );
        let nonce = [7u8; 12];
        let mut c = Cmsgs::new(Op::Encrypt, &nonce, Some(20)).expect("cmsgs");
        let mut want_iv = 12u32.to_ne_bytes().to_vec();
        want_iv.extend_from_slice(&nonce);
        assert_eq!(
            parsed(&mut c),
            vec![
                (SOL_ALG, ALG_SET_OP, op(nix::libc::ALG_OP_ENCRYPT)),
                (SOL_ALG, ALG_SET_IV, want_iv),
                (SOL_ALG, ALG_SET_AEAD_ASSOCLEN, 20u32.to_ne_bytes().to_vec()),
            ]
        );
        // The longest IV and all three messages fill the room exactly.
        let full = Cmsgs::new(Op::Encrypt, &[0; IV_MAX], Some(0)).expect("cmsgs");
        assert_eq!(full.len, CMSG_ROOM);
        assert!(Cmsgs::new(Op::Encrypt, &[0; IV_MAX + 1], None).is_err());
    }

    #[test]
    fn a_request_goes_out_whole_with_its_control_messages() {
        let sock = echo_socket();
        let body: Vec<u8> = (0..48).collect();
        let tail = [0xAB_u8; 16];
        let iv = [5u8; 16];
        sock.send(
            Op::Encrypt,
            &iv,
            None,
            &[IoSlice::new(&body), IoSlice::new(&tail)],
        )
        .expect("send");
        let mut out = [MaybeUninit::<u8>::uninit(); 64];
        sock.recv_into(&mut out).expect("read");
        // SAFETY: recv_into wrote every byte.
        let got: Vec<u8> = out.iter().map(|b| unsafe { b.assume_init() }).collect();
        assert_eq!(&got[..48], &body[..]);
        assert_eq!(&got[48..], &tail[..]);
        // With the AEAD's third message too, and no input at all.
        sock.send(Op::Decrypt, &[1; 12], Some(0), &[])
            .expect("send");
    }

    /// User-space cost of sending and reading one 16-byte request, for counting under
    /// valgrind (`--ignored`; HETCRYPT_SEND_LOOPS requests).
    #[test]
    #[ignore = "a cost probe, not a check: run under valgrind by hand"]
    fn send_and_read_cost_probe() {
        let loops: usize = std::env::var("HETCRYPT_SEND_LOOPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(1000);
        let sock = echo_socket();
        let input = [3u8; 16];
        let iv = [1u8; 16];
        let mut out = [MaybeUninit::<u8>::uninit(); 16];
        // HETCRYPT_SEND_WAY=nix: as the lane sent before, for comparison: the slices
        // and the control messages in vectors, through nix's `sendmsg` (which
        // allocates the control-message buffer).
        let nix_way = std::env::var("HETCRYPT_SEND_WAY").is_ok_and(|w| w == "nix");
        for _ in 0..loops {
            if nix_way {
                use nix::sys::socket::{ControlMessage, MsgFlags};
                let mut slices = Vec::with_capacity(2);
                slices.push(IoSlice::new(&input));
                let op = nix::libc::ALG_OP_ENCRYPT;
                let cmsgs = vec![ControlMessage::AlgSetOp(&op), ControlMessage::AlgSetIv(&iv)];
                socket::sendmsg::<AlgAddr>(
                    sock.fd.as_raw_fd(),
                    &slices,
                    &cmsgs,
                    MsgFlags::empty(),
                    None,
                )
                .expect("send");
            } else {
                sock.send(Op::Encrypt, &iv, None, &[IoSlice::new(&input)])
                    .expect("send");
            }
            sock.recv_into(&mut out).expect("read");
        }
    }
}
