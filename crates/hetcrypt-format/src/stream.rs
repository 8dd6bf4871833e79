//! Streaming encryption and decryption of one message: a reader becomes chunk jobs,
//! their outputs are written in order.
//!
//! A stream only ever holds the chunk it is reading; the [`Pipeline`](crate::Pipeline)
//! decides how many chunks (of how many streams) are in flight.

use std::fmt;
use std::io::{ErrorKind, IoSliceMut, Read, Write};
use std::sync::Arc;

use hetcrypt::{Dispatcher, Job, JobOutput, KeyId};

use crate::aead::{Aead, ChunkKeys};
use crate::error::{FormatError, Result};
use crate::header::{Wrapper, WRAPPER_LEN};
use crate::kdf::{self, Hash, InputKey};
use crate::manifest;
use crate::pipeline::Stream;
use crate::{CHUNK_SIZE, COMMITMENT_LEN, SALT_LEN};

/// How a message is framed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Framing {
    /// The hetcrypt wrapper header (naming AEAD and hash), then the C2SP ciphertext;
    /// the C2SP context is the wrapper header's bytes.
    Hetcrypt,
    /// A bare C2SP ciphertext with this context (as in the Wycheproof vectors); the
    /// reader must know the AEAD and hash.
    Bare {
        /// The C2SP context (may be empty).
        context: Vec<u8>,
    },
}

/// What an encryption uses.
#[derive(Clone, Debug)]
pub struct SealParams {
    aead: Aead,
    hash: Hash,
    framing: Framing,
    salt: Option<[u8; SALT_LEN]>,
    tree_path: Option<Vec<u8>>,
}

impl SealParams {
    /// Hetcrypt framing, HKDF-SHA-512 (Cobblestone), a random salt.
    pub fn new(aead: Aead) -> Self {
        SealParams {
            aead,
            hash: Hash::Sha512,
            framing: Framing::Hetcrypt,
            salt: None,
            tree_path: None,
        }
    }

    /// Makes the message a member of an encrypted tree at `path` (relative to the
    /// tree's root, `/`-separated; empty for the manifest): the wrapper's tree flag is
    /// set and the context binds the path (see [`crate::manifest`]).
    pub fn tree_path(mut self, path: impl Into<Vec<u8>>) -> Self {
        self.tree_path = Some(path.into());
        self
    }

    /// Uses another HKDF hash.
    pub fn hash(mut self, hash: Hash) -> Self {
        self.hash = hash;
        self
    }

    /// Writes a bare C2SP ciphertext with this context instead of the hetcrypt framing.
    pub fn bare(mut self, context: Vec<u8>) -> Self {
        self.framing = Framing::Bare { context };
        self
    }

    /// Uses this salt instead of a random one. **For tests and known answers only**:
    /// C2SP requires that a salt never repeats for an input key.
    pub fn with_salt_for_tests(mut self, salt: [u8; SALT_LEN]) -> Self {
        self.salt = Some(salt);
        self
    }

    /// The AEAD.
    pub fn aead(&self) -> Aead {
        self.aead
    }
}

/// What a decryption expects.
#[derive(Clone, Debug)]
pub enum OpenParams {
    /// A hetcrypt file: AEAD and hash come from its wrapper header.
    Hetcrypt,
    /// A bare C2SP ciphertext.
    Bare {
        /// The AEAD.
        aead: Aead,
        /// The HKDF hash.
        hash: Hash,
        /// The context.
        context: Vec<u8>,
    },
}

/// Where a stream writes its output: any writer, by copying each chunk's output (the
/// default), or a writer that takes the chunk's buffer whole, sparing the copy.
pub trait ChunkWrite: Write {
    /// Writes all of one chunk's output `data`, and returns a buffer for a later
    /// chunk's output to be written into (the pipeline hands it to the engines as a
    /// spare; its contents are never read): `data` itself once copied, by default, or
    /// one the writer has no more use for (empty if it has none).
    fn write_chunk(&mut self, data: Vec<u8>) -> std::io::Result<Vec<u8>> {
        self.write_all(&data)?;
        Ok(data)
    }
}

impl ChunkWrite for Vec<u8> {}

impl ChunkWrite for std::fs::File {}

impl ChunkWrite for std::io::Sink {}

impl ChunkWrite for std::io::Stdout {}

impl ChunkWrite for std::io::StdoutLock<'_> {}

impl<W: Write> ChunkWrite for std::io::BufWriter<W> {}

impl<T> ChunkWrite for std::io::Cursor<T> where std::io::Cursor<T>: Write {}

impl<W: ChunkWrite + ?Sized> ChunkWrite for &mut W {
    fn write_chunk(&mut self, data: Vec<u8>) -> std::io::Result<Vec<u8>> {
        (**self).write_chunk(data)
    }
}

impl<W: ChunkWrite + ?Sized> ChunkWrite for Box<W> {
    fn write_chunk(&mut self, data: Vec<u8>) -> std::io::Result<Vec<u8>> {
        (**self).write_chunk(data)
    }
}

/// Reads until `buf` is full or the input ends; returns how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A buffer of `len` bytes to read a chunk into, reusing one of `buffers` if there is
/// one (fresh chunk memory is not free: the allocator gives it back to the kernel
/// between batches, and each new page then costs a fault). A reused buffer keeps its
/// old bytes, which the read overwrites or the caller cuts off: only its growth is
/// zeroed (zeroing whole chunks cost a memset of every byte read). A fresh buffer has
/// room for a tag after the chunk: a chunk sealed in its own buffer
/// ([`hetcrypt::Dispatcher::run_in_place_in_line`]) gets its tag appended there, and
/// without the room each buffer was moved once into one of twice the size.
fn sized_buffer(buffers: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
    let mut buf = buffers
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(len + crate::aead::TAG_LEN));
    buf.resize(len, 0);
    buf
}

/// Most chunks read by one system call (see [`EncryptStream::read_ahead`]): 16 x 16
/// KiB = 256 KiB, the size `cp` reads at once, and as much memory held ahead of the
/// pipeline's window by the one stream being read.
pub const MAX_READ_AHEAD: usize = 16;

/// Reads a message as pieces of `piece` bytes, up to `depth` of them per system call
/// (`readv` into the pieces' own buffers: no copy). A piece is full unless the input
/// ended in it: the first piece that is not full (maybe empty) is the last one. Each
/// call reads until its pieces are full or the input ends, so the pieces are those
/// that reading one piece at a time gives, whatever the depth.
struct ChunkReader<R> {
    reader: R,
    piece: usize,
    depth: usize,
    /// Pieces read and not yet handed out, in order.
    ahead: std::collections::VecDeque<Vec<u8>>,
    /// The input ended: the last piece is in `ahead` (or was handed out).
    ended: bool,
}

impl<R: Read> ChunkReader<R> {
    fn new(reader: R, piece: usize) -> Self {
        ChunkReader {
            reader,
            piece,
            depth: 1,
            ahead: std::collections::VecDeque::new(),
            ended: false,
        }
    }

    /// The next piece, or `None` once the last one was handed out. `buffers` lends
    /// the memory to read into, and takes back what a read did not fill.
    fn next(&mut self, buffers: &mut Vec<Vec<u8>>) -> std::io::Result<Option<Vec<u8>>> {
        if self.ahead.is_empty() && !self.ended {
            self.fill(buffers)?;
        }
        Ok(self.ahead.pop_front())
    }

    /// Whether the input has nothing after the pieces handed out (reads ahead to know).
    fn at_end(&mut self, buffers: &mut Vec<Vec<u8>>) -> std::io::Result<bool> {
        if self.ahead.is_empty() && !self.ended {
            self.fill(buffers)?;
        }
        Ok(self.ahead.front().is_none_or(Vec::is_empty))
    }

    /// Reads up to `depth` pieces; the input's end, if met, is the last of them.
    fn fill(&mut self, buffers: &mut Vec<Vec<u8>>) -> std::io::Result<()> {
        let mut pieces: Vec<Vec<u8>> = (0..self.depth)
            .map(|_| sized_buffer(buffers, self.piece))
            .collect();
        // Filled so far: `full` whole pieces, and `part` bytes of the next one.
        let (mut full, mut part) = (0, 0);
        while full < pieces.len() {
            let (first, rest) = pieces[full..].split_first_mut().expect("full < len");
            let count = rest.len() + 1;
            // On the stack: no allocation per read (a tree's small files read once each).
            let mut slices: [IoSliceMut<'_>; MAX_READ_AHEAD] =
                std::array::from_fn(|_| IoSliceMut::new(&mut []));
            slices[0] = IoSliceMut::new(&mut first[part..]);
            for (slice, piece) in slices[1..].iter_mut().zip(rest.iter_mut()) {
                *slice = IoSliceMut::new(piece);
            }
            let n = match self.reader.read_vectored(&mut slices[..count]) {
                Ok(0) => {
                    self.ended = true;
                    break;
                }
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => {
                    buffers.append(&mut pieces);
                    return Err(e);
                }
            };
            part += n;
            full += part / self.piece;
            part %= self.piece;
        }
        let kept = if self.ended { full + 1 } else { full };
        buffers.extend(pieces.drain(kept..));
        if self.ended {
            if part == 0 {
                // An empty last piece needs no memory: its buffer goes back whole, so
                // the next read into it need not zero it again (16 KiB per file of a
                // tree of 16 KiB files).
                buffers.push(std::mem::take(&mut pieces[full]));
            } else {
                pieces[full].truncate(part);
            }
        }
        if self.ahead.is_empty() {
            // The pieces' own vector becomes the queue: no allocation.
            self.ahead = pieces.into();
        } else {
            self.ahead.extend(pieces);
        }
        Ok(())
    }

    fn into_inner(self) -> R {
        self.reader
    }
}

/// Encrypts one message from a reader to a writer.
pub struct EncryptStream<R, W> {
    reader: ChunkReader<R>,
    writer: W,
    input_key: Arc<InputKey>,
    params: SealParams,
    keys: Option<ChunkKeys>,
    next_in: u64,
    next_out: u64,
    input_done: bool,
    plaintext_bytes: u64,
    output_bytes: u64,
    commitment: Option<[u8; COMMITMENT_LEN]>,
}

impl<R, W> fmt::Debug for EncryptStream<R, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncryptStream")
            .field("aead", &self.params.aead)
            .field("next_in", &self.next_in)
            .finish_non_exhaustive()
    }
}

impl<R: Read, W: Write> EncryptStream<R, W> {
    /// A stream that encrypts `reader` into `writer` under `input_key` (whose length
    /// must be the AEAD's key length).
    pub fn new(reader: R, writer: W, input_key: &[u8], params: SealParams) -> Self {
        Self::with_key(reader, writer, Arc::new(InputKey::new(input_key)), params)
    }

    /// The same under an input key shared with other streams (keyed once for all: see
    /// [`InputKey`]).
    pub fn with_key(reader: R, writer: W, input_key: Arc<InputKey>, params: SealParams) -> Self {
        EncryptStream {
            reader: ChunkReader::new(reader, CHUNK_SIZE),
            writer,
            input_key,
            params,
            keys: None,
            next_in: 0,
            next_out: 0,
            input_done: false,
            plaintext_bytes: 0,
            output_bytes: 0,
            commitment: None,
        }
    }

    /// Reads up to `chunks` chunks per system call (at most [`MAX_READ_AHEAD`]; 1, the
    /// default, reads one at a time): fewer system calls for a large file, and as many
    /// chunks' memory more held by the stream. Reading blocks until they are all read
    /// or the input ends, so a pipe whose writer pauses wants the default.
    pub fn read_ahead(mut self, chunks: usize) -> Self {
        self.reader.depth = chunks.clamp(1, MAX_READ_AHEAD);
        self
    }

    /// The key commitment written in the header (once the first job was handed out):
    /// what a tree's manifest records of this message.
    pub fn commitment(&self) -> Option<[u8; COMMITMENT_LEN]> {
        self.commitment
    }

    /// Plaintext bytes read so far.
    pub fn plaintext_bytes(&self) -> u64 {
        self.plaintext_bytes
    }

    /// Bytes written so far (headers and chunks).
    pub fn output_bytes(&self) -> u64 {
        self.output_bytes
    }

    /// The writer (and reader), once the stream is done with them.
    pub fn into_parts(self) -> (R, W) {
        (self.reader.into_inner(), self.writer)
    }

    /// Derives the message keys and writes the headers.
    fn start(&mut self, dispatcher: &Dispatcher) -> Result<ChunkKeys> {
        let aead = self.params.aead;
        let salt = match self.params.salt {
            Some(salt) => salt,
            None => crate::salt::fresh()?,
        };
        let context: Vec<u8> = match &self.params.framing {
            Framing::Hetcrypt => {
                let wrapper = Wrapper {
                    aead,
                    hash: self.params.hash,
                    tree: self.params.tree_path.is_some(),
                }
                .to_bytes();
                self.writer.write_all(&wrapper)?;
                self.output_bytes += WRAPPER_LEN as u64;
                match &self.params.tree_path {
                    Some(path) => manifest::member_context(&wrapper, path),
                    None => wrapper.to_vec(),
                }
            }
            Framing::Bare { context } => context.clone(),
        };
        let derived = kdf::derive_with(self.params.hash, aead, &self.input_key, &salt, &context)?;
        self.writer.write_all(&salt)?;
        self.writer.write_all(&derived.commitment)?;
        self.commitment = Some(derived.commitment);
        self.output_bytes += (SALT_LEN + COMMITMENT_LEN) as u64;
        ChunkKeys::new(dispatcher, aead, &derived.key, &derived.base_nonce)
    }
}

impl<R: Read, W: ChunkWrite> Stream for EncryptStream<R, W> {
    fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>> {
        self.next_job_into(dispatcher, &mut Vec::new())
    }

    fn next_job_into(
        &mut self,
        dispatcher: &Dispatcher,
        buffers: &mut Vec<Vec<u8>>,
    ) -> Result<Option<Job>> {
        if self.input_done {
            return Ok(None);
        }
        if self.keys.is_none() {
            self.keys = Some(self.start(dispatcher)?);
        }
        let keys = self.keys.as_ref().expect("set just above");
        let chunk = self
            .reader
            .next(buffers)?
            .expect("the reader is asked again only before its last piece");
        let n = chunk.len();
        // The one correct chunking: full chunks, then a final one that is shorter
        // (empty when the message is a multiple of 16 KiB, or empty).
        self.input_done = n < CHUNK_SIZE;
        self.plaintext_bytes += n as u64;
        let job = keys.seal_job(self.next_in, chunk)?;
        self.next_in += 1;
        Ok(Some(job))
    }

    fn accept_reusing(
        &mut self,
        output: hetcrypt::Result<JobOutput>,
        spare: &mut Vec<JobOutput>,
    ) -> Result<()> {
        let keys = self
            .keys
            .as_ref()
            .expect("a job was handed out, so keys exist");
        let data = keys.seal_finish(self.next_out, output)?;
        let len = data.len() as u64;
        let data = self.writer.write_chunk(data)?;
        self.output_bytes += len;
        self.next_out += 1;
        // Not cleared: every engine replaces a spare's contents (`run_reusing`), and
        // one that keeps its length is zeroed only where it grows (clearing it cost a
        // memset of every output byte, 2.6% of a 1 GiB run).
        if data.capacity() > 0 {
            spare.push(JobOutput { data, tag: None });
        }
        Ok(())
    }

    fn key(&self) -> Option<KeyId> {
        self.keys.as_ref().map(ChunkKeys::key_id)
    }

    fn finish(&mut self) -> Result<()> {
        debug_assert!(self.input_done && self.next_out == self.next_in);
        self.writer.flush()?;
        Ok(())
    }
}

/// Decrypts one message from a reader to a writer.
///
/// Each chunk is authenticated before its plaintext is written, but the message as a
/// whole (its length: no truncation, no trailing data) is authenticated only when
/// [`Stream::finish`] succeeds: until then the writer holds *unauthenticated* output
/// that a caller must not release (the CLI writes to a temporary file and renames it
/// only then).
pub struct DecryptStream<R, W> {
    reader: ChunkReader<R>,
    writer: W,
    input_key: Arc<InputKey>,
    params: OpenParams,
    keys: Option<ChunkKeys>,
    next_in: u64,
    next_out: u64,
    last: Option<u64>,
    plaintext_bytes: u64,
    input_bytes: u64,
    input_len: Option<u64>,
    tree: Option<(Vec<u8>, Option<[u8; COMMITMENT_LEN]>)>,
}

impl<R, W> fmt::Debug for DecryptStream<R, W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DecryptStream")
            .field("next_in", &self.next_in)
            .finish_non_exhaustive()
    }
}

impl<R: Read, W: Write> DecryptStream<R, W> {
    /// A stream that decrypts `reader` into `writer` under `input_key`.
    pub fn new(reader: R, writer: W, input_key: &[u8], params: OpenParams) -> Self {
        Self::with_key(reader, writer, Arc::new(InputKey::new(input_key)), params)
    }

    /// The same under an input key shared with other streams (keyed once for all: see
    /// [`InputKey`]).
    pub fn with_key(reader: R, writer: W, input_key: Arc<InputKey>, params: OpenParams) -> Self {
        DecryptStream {
            // The piece length is the AEAD's full chunk, set once the header names it;
            // whether a full chunk was the last one is known by reading the next piece.
            reader: ChunkReader::new(reader, CHUNK_SIZE),
            writer,
            input_key,
            params,
            keys: None,
            next_in: 0,
            next_out: 0,
            last: None,
            plaintext_bytes: 0,
            input_bytes: 0,
            input_len: None,
            tree: None,
        }
    }

    /// The message is read as a member of an encrypted tree at `path` (empty: the
    /// manifest), whose manifest lists `commitment` for it (`None` when reading the
    /// manifest itself). Its header must carry the tree flag and that commitment,
    /// checked before any chunk runs. Without this, a tree member is refused
    /// ([`FormatError::TreeMember`]).
    pub fn in_tree(
        mut self,
        path: impl Into<Vec<u8>>,
        commitment: Option<[u8; COMMITMENT_LEN]>,
    ) -> Self {
        self.tree = Some((path.into(), commitment));
        self
    }

    /// The whole input is `len` bytes long (a file's size): a length no message can
    /// have fails once the header is read, before any chunk runs.
    pub fn with_input_len(mut self, len: u64) -> Self {
        self.input_len = Some(len);
        self
    }

    /// Authenticated plaintext bytes written so far.
    pub fn plaintext_bytes(&self) -> u64 {
        self.plaintext_bytes
    }

    /// Ciphertext bytes read so far.
    pub fn input_bytes(&self) -> u64 {
        self.input_bytes
    }

    /// The AEAD, once the header has been read.
    pub fn aead(&self) -> Option<Aead> {
        self.keys.as_ref().map(ChunkKeys::aead)
    }

    /// The writer (and reader), once the stream is done with them.
    pub fn into_parts(self) -> (R, W) {
        (self.reader.into_inner(), self.writer)
    }

    /// Reads ahead as [`EncryptStream::read_ahead`] does.
    pub fn read_ahead(mut self, chunks: usize) -> Self {
        self.reader.depth = chunks.clamp(1, MAX_READ_AHEAD);
        self
    }

    /// Reads the headers and checks the commitment, before any chunk is decrypted.
    fn start(&mut self, dispatcher: &Dispatcher) -> Result<ChunkKeys> {
        // Wrapper, salt and commitment in one read.
        let wrapper_len = match &self.params {
            OpenParams::Hetcrypt => WRAPPER_LEN,
            OpenParams::Bare { .. } => 0,
        };
        let mut head = [0u8; WRAPPER_LEN + SALT_LEN + COMMITMENT_LEN];
        let head = &mut head[..wrapper_len + SALT_LEN + COMMITMENT_LEN];
        let got = read_full(&mut self.reader.reader, head)?;
        self.input_bytes += got as u64;
        let (wrapper_bytes, header) = head.split_at(wrapper_len);
        let (aead, hash, context): (Aead, Hash, Vec<u8>) = match &self.params {
            OpenParams::Hetcrypt => {
                let w = Wrapper::parse(&wrapper_bytes[..got.min(wrapper_len)])?;
                let context = match (&self.tree, w.tree) {
                    (Some((path, _)), true) => {
                        let wrapper: &[u8; WRAPPER_LEN] =
                            wrapper_bytes.try_into().expect("split at WRAPPER_LEN");
                        manifest::member_context(wrapper, path)
                    }
                    (None, false) => wrapper_bytes.to_vec(),
                    // A tree member alone: only its manifest can vouch for it.
                    (None, true) => return Err(FormatError::TreeMember),
                    // At a path the manifest lists, a message that is no member.
                    (Some(_), false) => return Err(FormatError::ManifestMismatch),
                };
                (w.aead, w.hash, context)
            }
            OpenParams::Bare {
                aead,
                hash,
                context,
            } => (*aead, *hash, context.clone()),
        };
        if self.input_key.len() != aead.key_len() {
            return Err(FormatError::KeyLength {
                aead,
                expected: aead.key_len(),
                got: self.input_key.len(),
            });
        }
        let n = got - wrapper_len;
        if n < header.len() {
            return Err(FormatError::Truncated(format!(
                "the header has {n} of its {} bytes (salt and commitment)",
                header.len()
            )));
        }
        let (salt, commitment) = header.split_at(SALT_LEN);
        let salt: &[u8; SALT_LEN] = salt.try_into().expect("split at SALT_LEN");
        if let Some((_, Some(listed))) = &self.tree {
            // Public values: the manifest pins this exact message (salt and key).
            if listed.as_slice() != commitment {
                return Err(FormatError::ManifestMismatch);
            }
        }
        let derived = kdf::derive_with(hash, aead, &self.input_key, salt, &context)?;
        if !openssl::memcmp::eq(&derived.commitment, commitment) {
            return Err(FormatError::WrongKey);
        }
        if let Some(len) = self.input_len {
            let chunks = len.saturating_sub(self.input_bytes);
            if !aead.possible_chunks_len(chunks) {
                return Err(FormatError::BadLength { len });
            }
        }
        ChunkKeys::new(dispatcher, aead, &derived.key, &derived.base_nonce)
    }
}

impl<R: Read, W: ChunkWrite> Stream for DecryptStream<R, W> {
    fn next_job(&mut self, dispatcher: &Dispatcher) -> Result<Option<Job>> {
        self.next_job_into(dispatcher, &mut Vec::new())
    }

    fn next_job_into(
        &mut self,
        dispatcher: &Dispatcher,
        buffers: &mut Vec<Vec<u8>>,
    ) -> Result<Option<Job>> {
        if self.last.is_some() {
            return Ok(None);
        }
        if self.keys.is_none() {
            self.keys = Some(self.start(dispatcher)?);
        }
        let keys = self.keys.as_ref().expect("set just above");
        let full = keys.aead().full_chunk_len();
        self.reader.piece = full;
        let piece = self
            .reader
            .next(buffers)?
            .expect("the reader is asked again only before its last piece");
        let n = piece.len();
        self.input_bytes += n as u64;
        let last = if n < full {
            true
        } else if self.reader.at_end(buffers)? {
            // A full chunk can never be the last one.
            return Err(FormatError::Truncated(format!(
                "the input ends after full chunk {}: the final short chunk is missing",
                self.next_in
            )));
        } else {
            false
        };
        let index = self.next_in;
        let job = keys.open_job(index, piece, last)?;
        self.next_in += 1;
        if last {
            self.last = Some(index);
        }
        Ok(Some(job))
    }

    fn accept_reusing(
        &mut self,
        output: hetcrypt::Result<JobOutput>,
        spare: &mut Vec<JobOutput>,
    ) -> Result<()> {
        let keys = self
            .keys
            .as_ref()
            .expect("a job was handed out, so keys exist");
        let last = self.last == Some(self.next_out);
        let data = keys.open_finish(self.next_out, output, last)?;
        let len = data.len() as u64;
        let data = self.writer.write_chunk(data)?;
        self.plaintext_bytes += len;
        self.next_out += 1;
        // Not cleared, as in `EncryptStream::accept_reusing`.
        if data.capacity() > 0 {
            spare.push(JobOutput { data, tag: None });
        }
        Ok(())
    }

    fn key(&self) -> Option<KeyId> {
        self.keys.as_ref().map(ChunkKeys::key_id)
    }

    fn finish(&mut self) -> Result<()> {
        match self.last {
            Some(last) if self.next_out == last + 1 => {
                self.writer.flush()?;
                Ok(())
            }
            _ => Err(FormatError::Truncated("the message ended early".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Driven by hand (`next_job`, not the pipeline's `next_job_into`), each stream
    /// hands out its chunk jobs: an encryption of two chunks two jobs, and its
    /// decryption as many.
    #[test]
    fn streams_hand_out_their_jobs_through_next_job() {
        use crate::pipeline::Stream;
        use hetcrypt::engine::cpu::CpuEngine;
        let d = Dispatcher::new(vec![CpuEngine::with_lanes(1).into_engine()]).unwrap();
        let key = [5u8; 16];
        let pt = vec![9u8; crate::CHUNK_SIZE + 10];
        let mut enc =
            EncryptStream::new(&pt[..], Vec::new(), &key, SealParams::new(Aead::Aes128Gcm));
        let mut jobs = Vec::new();
        while let Some(job) = enc.next_job(&d).unwrap() {
            jobs.push(job);
        }
        assert_eq!(jobs.len(), 2);
        let run = d.run(&jobs, &hetcrypt::policy::Pull).unwrap();
        for out in run.outputs {
            enc.accept(out).unwrap();
        }
        enc.finish().unwrap();
        let ct = enc.into_parts().1;
        let mut dec = DecryptStream::new(&ct[..], Vec::new(), &key, OpenParams::Hetcrypt);
        let mut n = 0;
        while dec.next_job(&d).unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 2);
    }

    /// A boxed writer and a borrowed one write each chunk through to the writer they
    /// hold, and hand back a buffer as it does.
    #[test]
    fn boxed_and_borrowed_writers_write_chunks_through() {
        let mut boxed: Box<Vec<u8>> = Box::default();
        let back = <Box<Vec<u8>> as ChunkWrite>::write_chunk(&mut boxed, vec![1, 2, 3]).unwrap();
        assert_eq!((boxed.as_slice(), back), (&[1, 2, 3][..], vec![1, 2, 3]));
        let mut inner = Vec::new();
        let mut borrowed = &mut inner;
        let back = <&mut Vec<u8> as ChunkWrite>::write_chunk(&mut borrowed, vec![4, 5]).unwrap();
        assert_eq!((inner, back), (vec![4, 5], vec![4, 5]));
    }

    #[test]
    fn a_fresh_read_buffer_has_room_for_the_chunks_tag() {
        let mut none = Vec::new();
        let buf = sized_buffer(&mut none, CHUNK_SIZE);
        assert_eq!(buf.len(), CHUNK_SIZE);
        assert!(buf.capacity() >= CHUNK_SIZE + crate::aead::TAG_LEN);
        // A reused one keeps its allocation.
        let mut kept = vec![Vec::with_capacity(3 * CHUNK_SIZE)];
        let ptr = kept[0].as_ptr();
        let reused = sized_buffer(&mut kept, CHUNK_SIZE);
        assert_eq!(reused.as_ptr(), ptr);
    }

    /// However the pieces are asked for, fewer than `depth` stay held ahead of the
    /// caller after each (the memory bound counts at most MAX_READ_AHEAD per stream),
    /// and they come in order.
    #[test]
    fn a_chunk_reader_holds_less_than_depth_pieces_ahead() {
        let input: Vec<u8> = (0..10 * 8 + 3).map(|i| i as u8).collect();
        let mut r = ChunkReader::new(&input[..], 8);
        r.depth = 3;
        let mut buffers = Vec::new();
        let mut got = Vec::new();
        while let Some(piece) = r.next(&mut buffers).unwrap() {
            assert!(r.ahead.len() < r.depth, "{} pieces ahead", r.ahead.len());
            got.extend_from_slice(&piece);
        }
        assert_eq!(got, input);
        assert!(r.at_end(&mut buffers).unwrap());
    }
}
