//! Reading a load's tensors: the checkpoint's files read forward, tensor
//! by tensor, straight into values or into converted bytes.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};

use crate::checkpoint::codec::{Codec, Old, Source};
use crate::checkpoint::dtype::Dtype;
use crate::checkpoint::error::Error;
use crate::checkpoint::float_convert::convert_floats;
use crate::checkpoint::header::FileTensor;
use crate::checkpoint::source::Part;
use crate::{ScopeTree, VarId, short};

/// The read buffer: small tensors are read through it, large ones straight
/// into their values.
pub(crate) const READ_BUFFER: usize = 64 * 1024;

/// The checkpoint's files, each read forward tensor by tensor; one is
/// open for reading at a time.
pub(super) struct Cursor<'p> {
    parts: &'p [Part],
    /// The part being read, its reader and the reader's position.
    open: Option<(usize, BufReader<&'p File>, u64)>,
}

impl<'p> Cursor<'p> {
    /// A cursor over `parts`, none of them open yet.
    pub(super) fn new(parts: &'p [Part]) -> Self {
        Self { parts, open: None }
    }

    /// Moves to the start of `t`'s bytes in `part`; returns the reader and
    /// the bytes' length.
    fn seek_to(
        &mut self,
        part: usize,
        t: &FileTensor,
    ) -> Result<(&mut BufReader<&'p File>, usize), Error> {
        let p = &self.parts[part];
        let at = p.data_start + t.begin;
        let parts = self.parts;
        let io = |e: std::io::Error| Error::io(&parts[part].path.to_string_lossy())(e);
        let same = matches!(&self.open, Some((cur, ..)) if *cur == part);
        if !same {
            let mut reader = BufReader::with_capacity(READ_BUFFER, &p.file);
            reader.seek(SeekFrom::Start(at)).map_err(io)?;
            self.open = Some((part, reader, at));
        }
        let Some((_, reader, pos)) = &mut self.open else {
            unreachable!("a part was opened just above")
        };
        if at != *pos {
            let delta = i64::try_from(i128::from(at) - i128::from(*pos))
                .map_err(|e| io(std::io::Error::other(e)))?;
            reader.seek_relative(delta).map_err(io)?;
        }
        // Bounded by the file's length (checked with the header).
        #[allow(clippy::cast_possible_truncation)]
        let nbytes = (t.end - t.begin) as usize;
        *pos = at + nbytes as u64;
        Ok((reader, nbytes))
    }

    /// Builds the staged value of `t` with `codec` (converting floats to
    /// `convert_to`), touching no variable.
    pub(super) fn stage(
        &mut self,
        part: usize,
        t: &FileTensor,
        codec: &Codec,
        convert_to: Option<Dtype>,
    ) -> Result<Old, Error> {
        let parts = self.parts;
        let shown = || parts[part].path.to_string_lossy();
        let (reader, nbytes) = self.seek_to(part, t)?;
        let src = match convert_to {
            None => Source::Reader {
                dtype: t.dtype,
                shape: &t.shape,
                nbytes,
                reader,
            },
            Some(to) => {
                let mut raw = vec![0_u8; nbytes];
                reader
                    .read_exact(&mut raw)
                    .map_err(|e| Error::io(&shown())(e))?;
                Source::Bytes {
                    dtype: to,
                    shape: &t.shape,
                    bytes: convert_floats(t.dtype, to, &raw),
                }
            }
        };
        (codec.stage)(src).map_err(|e| with_path(e, &shown()))
    }

    /// Reads `t` into `var`'s value in place; the replaced value if the
    /// value declined (then it was replaced).
    // Inlined into the load's pass, as when both lived in one module.
    #[inline]
    pub(super) fn in_place(
        &mut self,
        tree: &mut ScopeTree,
        part: usize,
        t: &FileTensor,
        var: VarId,
        codec: &Codec,
    ) -> Result<Option<Old>, Error> {
        let parts = self.parts;
        let (reader, nbytes) = self.seek_to(part, t)?;
        let src = Source::Reader {
            dtype: t.dtype,
            shape: &t.shape,
            nbytes,
            reader,
        };
        (codec.read_into)(tree, var, src)
            .map_err(|e| with_path(e, &parts[part].path.to_string_lossy()))
    }
}

/// An IO error of a codec, with the file's path.
fn with_path(e: Error, shown: &str) -> Error {
    match e {
        Error::Io { source, .. } => Error::Io {
            path: short::path(shown),
            source,
        },
        other => other,
    }
}
