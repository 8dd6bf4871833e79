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
use nix::sys::socket::{self, sockopt, AddressFamily, AlgAddr, ControlMessage, MsgFlags, SockFlag};

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
    /// [`OpSocket::send_limit`], so this never waits for buffer space that only a
    /// `read` could free.
    pub fn send(
        &self,
        op: Op,
        iv: &[u8],
        assoclen: Option<u32>,
        input: &[IoSlice<'_>],
    ) -> Result<(), SysError> {
        let op = match op {
            Op::Encrypt => nix::libc::ALG_OP_ENCRYPT,
            Op::Decrypt => nix::libc::ALG_OP_DECRYPT,
        };
        let assoc = assoclen.unwrap_or(0);
        let mut cmsgs = vec![ControlMessage::AlgSetOp(&op), ControlMessage::AlgSetIv(iv)];
        if assoclen.is_some() {
            cmsgs.push(ControlMessage::AlgSetAeadAssoclen(&assoc));
        }
        let want: usize = input.iter().map(|s| s.len()).sum();
        let sent =
            socket::sendmsg::<AlgAddr>(self.fd.as_raw_fd(), input, &cmsgs, MsgFlags::empty(), None)
                .map_err(at("sendmsg"))?;
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
        let op = match op {
            Op::Encrypt => nix::libc::ALG_OP_ENCRYPT,
            Op::Decrypt => nix::libc::ALG_OP_DECRYPT,
        };
        let cmsgs = [ControlMessage::AlgSetOp(&op), ControlMessage::AlgSetIv(iv)];
        // `nix` names no `MSG_MORE`: the request goes on, its data follows.
        let more = MsgFlags::from_bits_retain(nix::libc::MSG_MORE);
        socket::sendmsg::<AlgAddr>(self.fd.as_raw_fd(), &[], &cmsgs, more, None)
            .map_err(at("sendmsg (control)"))?;
        pipe.feed(input, &self.fd)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
