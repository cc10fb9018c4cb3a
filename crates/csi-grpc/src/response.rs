use std::fmt;

use zeroize::Zeroizing;

use crate::path::FilePath;
use crate::request::{FileMode, ObjectVersion};

/// The bytes of a mounted file. Wiped from memory when dropped; never printed.
///
/// The copy that prost encodes onto the wire is outside our reach (see ARCHITECTURE.md).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct FileContents(Zeroizing<Vec<u8>>);

impl FileContents {
    /// Takes ownership of `bytes`.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, moved out without a copy. The buffer then belongs to the caller (prost's
    /// message, in the server) and is no longer wiped on drop.
    pub fn into_vec(mut self) -> Vec<u8> {
        std::mem::take(&mut *self.0)
    }

    /// Number of bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for FileContents {
    fn from(bytes: Vec<u8>) -> Self {
        Self::new(bytes)
    }
}

impl fmt::Debug for FileContents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileContents([redacted; {} bytes])", self.0.len())
    }
}

/// One file for the driver to write into the pod's volume.
#[derive(Clone, Debug)]
pub struct File {
    /// Where, relative to the mount.
    pub path: FilePath,
    /// The file mode.
    pub mode: FileMode,
    /// What.
    pub contents: FileContents,
}

/// A successful mount: the files and the versions of the objects they came from.
#[derive(Clone, Debug, Default)]
pub struct MountResponse {
    /// Files, in the order of the request's objects.
    pub files: Vec<File>,
    /// One entry per object; the driver fails a mount that reports none.
    pub object_versions: Vec<ObjectVersion>,
}
