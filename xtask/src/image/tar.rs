//! A reproducible tar writer: ustar headers set by hand, entries in byte order of their
//! paths (parents first), numeric owners without names, one mtime for every entry, and the
//! end marker (two zero blocks) that some writers leave out.

use std::collections::BTreeMap;

use anyhow::{Context, bail};

const BLOCK: usize = 512;

/// What an entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
}

/// One entry: its path inside the archive (relative, no leading `/`), mode and owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) path: String,
    pub(crate) mode: u32,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) kind: Kind,
}

impl Entry {
    pub(crate) fn file(path: &str, mode: u32, bytes: Vec<u8>) -> Self {
        Self::owned(path, mode, Kind::File(bytes))
    }

    pub(crate) fn dir(path: &str, mode: u32) -> Self {
        Self::owned(path, mode, Kind::Dir)
    }

    pub(crate) fn symlink(path: &str, target: &str) -> Self {
        Self::owned(path, 0o777, Kind::Symlink(target.to_owned()))
    }

    fn owned(path: &str, mode: u32, kind: Kind) -> Self {
        Self {
            path: path.trim_matches('/').to_owned(),
            mode,
            uid: 0,
            gid: 0,
            kind,
        }
    }

    pub(crate) fn owner(mut self, uid: u32, gid: u32) -> Self {
        self.uid = uid;
        self.gid = gid;
        self
    }
}

/// The entries of one archive, by path: a second entry for a path must be the same entry.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    entries: BTreeMap<String, Entry>,
}

impl Tree {
    pub(crate) fn add(&mut self, entry: Entry) -> anyhow::Result<()> {
        if entry.path.is_empty() || entry.path.split('/').any(|p| p.is_empty() || p == "..") {
            bail!("tar: {:?} is not a relative path", entry.path);
        }
        match self.entries.get(&entry.path) {
            Some(existing) if *existing != entry => {
                bail!("tar: two different entries for {}", entry.path)
            }
            Some(_) => {}
            None => {
                self.entries.insert(entry.path.clone(), entry);
            }
        }
        Ok(())
    }

    /// The bytes of the files, for the image's "unpacked" size.
    pub(crate) fn content_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| match &e.kind {
                Kind::File(bytes) => bytes.len() as u64,
                _ => 0,
            })
            .sum()
    }

    /// The archive: every missing parent directory added (0755, root), then the entries in
    /// byte order of their paths, each with `mtime`, then the end marker.
    pub(crate) fn write(mut self, mtime: u64) -> anyhow::Result<Vec<u8>> {
        let parents: Vec<String> = self
            .entries
            .keys()
            .flat_map(|path| {
                path.match_indices('/')
                    .map(|(at, _)| path[..at].to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        for parent in parents {
            match self.entries.get(&parent) {
                Some(Entry {
                    kind: Kind::Dir, ..
                }) => {}
                Some(_) => bail!("tar: {parent} is a parent directory and not a directory"),
                None => {
                    self.entries
                        .insert(parent.clone(), Entry::dir(&parent, 0o755));
                }
            }
        }
        let mut out = Vec::new();
        for entry in self.entries.values() {
            write_entry(&mut out, entry, mtime)?;
        }
        out.resize(out.len() + 2 * BLOCK, 0);
        Ok(out)
    }
}

fn write_entry(out: &mut Vec<u8>, entry: &Entry, mtime: u64) -> anyhow::Result<()> {
    let (typeflag, size, link, data): (u8, usize, &str, &[u8]) = match &entry.kind {
        Kind::File(bytes) => (b'0', bytes.len(), "", bytes),
        Kind::Dir => (b'5', 0, "", &[]),
        Kind::Symlink(target) => (b'2', 0, target.as_str(), &[]),
    };
    let name = match entry.kind {
        Kind::Dir => format!("{}/", entry.path),
        _ => entry.path.clone(),
    };
    let (prefix, name) = split_name(&name)?;
    let mut header = [0u8; BLOCK];
    put(&mut header[0..100], name.as_bytes(), "name")?;
    octal(&mut header[100..108], u64::from(entry.mode & 0o7777))?;
    octal(&mut header[108..116], u64::from(entry.uid))?;
    octal(&mut header[116..124], u64::from(entry.gid))?;
    octal(&mut header[124..136], size as u64)?;
    octal(&mut header[136..148], mtime)?;
    header[156] = typeflag;
    put(&mut header[157..257], link.as_bytes(), "link target")?;
    header[257..263].copy_from_slice(b"ustar\0");
    header[263..265].copy_from_slice(b"00");
    // uname and gname stay empty: owners are numeric. devmajor/devminor are zero.
    octal(&mut header[329..337], 0)?;
    octal(&mut header[337..345], 0)?;
    put(&mut header[345..500], prefix.as_bytes(), "prefix")?;
    // The checksum is computed with its own field as eight spaces.
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| u32::from(*b)).sum();
    let text = format!("{sum:06o}\0 ");
    header[148..156].copy_from_slice(text.as_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    let padding = (BLOCK - data.len() % BLOCK) % BLOCK;
    out.resize(out.len() + padding, 0);
    Ok(())
}

/// ustar's two name fields: `prefix` (155 bytes) and `name` (100), split at a `/`.
fn split_name(path: &str) -> anyhow::Result<(&str, &str)> {
    if path.len() <= 100 {
        return Ok(("", path));
    }
    let trailing = usize::from(path.ends_with('/'));
    let body = &path[..path.len() - trailing];
    for (at, _) in body.rmatch_indices('/') {
        let (prefix, name) = (&path[..at], &path[at + 1..]);
        if prefix.len() <= 155 && name.len() <= 100 {
            return Ok((prefix, name));
        }
    }
    bail!("tar: {path} is too long for a ustar header")
}

fn put(field: &mut [u8], value: &[u8], what: &str) -> anyhow::Result<()> {
    let room = field.get_mut(..value.len()).with_context(|| {
        format!(
            "tar: the {what} {:?} is too long",
            String::from_utf8_lossy(value)
        )
    })?;
    room.copy_from_slice(value);
    Ok(())
}

/// An octal number filling `field` but its last byte (a NUL), zero-padded.
fn octal(field: &mut [u8], value: u64) -> anyhow::Result<()> {
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    if text.len() > digits {
        bail!("tar: {value} does not fit a {digits}-digit field");
    }
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
    Ok(())
}

/// `bytes` gzipped reproducibly: no name, mtime 0, the best compression.
pub(crate) fn gzip(bytes: &[u8]) -> anyhow::Result<Vec<u8>> {
    use std::io::Write as _;
    let mut encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes)?;
    Ok(encoder.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over ustar's 100-byte name: it goes in the prefix field.
    fn long_path() -> String {
        format!(
            "usr/share/doc/{}/{}/copyright",
            "p".repeat(60),
            "q".repeat(60)
        )
    }

    fn sample() -> Tree {
        let mut tree = Tree::default();
        tree.add(Entry::file(
            "etc/passwd",
            0o644,
            b"root:x:0:0::/root:/sbin/nologin\n".to_vec(),
        ))
        .unwrap();
        tree.add(Entry::dir("tmp", 0o1777)).unwrap();
        tree.add(Entry::symlink("lib64/ld.so", "/lib/x86_64-linux-gnu/ld.so"))
            .unwrap();
        tree.add(Entry::dir("home/nonroot", 0o700).owner(65532, 65532))
            .unwrap();
        tree.add(Entry::file(&long_path(), 0o644, b"c".to_vec()))
            .unwrap();
        tree
    }

    #[test]
    fn the_system_tar_reads_what_we_write_as_we_meant_it() {
        let bytes = sample().write(1_700_000_000).unwrap();
        assert_eq!(bytes.len() % BLOCK, 0);
        assert!(
            bytes[bytes.len() - 2 * BLOCK..].iter().all(|b| *b == 0),
            "end marker"
        );
        let dir = tempfile::tempdir().unwrap();
        let archive = dir.path().join("a.tar");
        std::fs::write(&archive, &bytes).unwrap();
        let output = std::process::Command::new("tar")
            .args(["--numeric-owner", "--full-time", "-tvf"])
            .arg(&archive)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let listing = String::from_utf8(output.stdout).unwrap();
        let lines: Vec<Vec<&str>> = listing
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let names: Vec<&str> = lines.iter().map(|l| l[5]).collect();
        assert_eq!(
            names,
            [
                "etc/",
                "etc/passwd",
                "home/",
                "home/nonroot/",
                "lib64/",
                "lib64/ld.so",
                "tmp/",
                "usr/",
                "usr/share/",
                "usr/share/doc/",
                &format!("usr/share/doc/{}/", "p".repeat(60)),
                &format!("usr/share/doc/{}/{}/", "p".repeat(60), "q".repeat(60)),
                &long_path(),
            ],
            "{listing}"
        );
        let line = |name: &str| lines.iter().find(|l| l[5] == name).unwrap().clone();
        assert_eq!(line("tmp/")[0], "drwxrwxrwt");
        assert_eq!(line("home/nonroot/")[..2], ["drwx------", "65532/65532"]);
        assert_eq!(line("etc/passwd")[..3], ["-rw-r--r--", "0/0", "32"]);
        assert_eq!(line("lib64/ld.so")[7], "/lib/x86_64-linux-gnu/ld.so");
        assert!(
            lines
                .iter()
                .all(|l| l[3] == "2023-11-14" && l[4] == "22:13:20"),
            "{listing}"
        );
    }

    #[test]
    fn the_same_entries_in_any_order_make_the_same_bytes() {
        let a = sample().write(1).unwrap();
        let mut tree = Tree::default();
        let mut entries: Vec<Entry> = sample().entries.into_values().collect();
        entries.reverse();
        for entry in entries {
            tree.add(entry).unwrap();
        }
        assert_eq!(tree.write(1).unwrap(), a);
        assert_eq!(gzip(&a).unwrap(), gzip(&a).unwrap());
    }

    #[test]
    fn conflicting_entries_and_paths_that_leave_the_root_are_refused() {
        let mut tree = sample();
        assert!(tree.add(Entry::file("etc/passwd", 0o600, vec![])).is_err());
        assert!(
            tree.add(Entry::file(
                "etc/passwd",
                0o644,
                b"root:x:0:0::/root:/sbin/nologin\n".to_vec()
            ))
            .is_ok()
        );
        assert!(tree.add(Entry::file("../etc", 0o644, vec![])).is_err());
        assert!(tree.add(Entry::file("etc//x", 0o644, vec![])).is_err());
        let mut tree = Tree::default();
        tree.add(Entry::file("a", 0o644, vec![])).unwrap();
        tree.add(Entry::file("a/b", 0o644, vec![])).unwrap();
        assert!(tree.write(0).is_err(), "a file cannot be a parent");
        let mut tree = Tree::default();
        tree.add(Entry::file(
            &format!("a/{}", "x".repeat(101)),
            0o644,
            vec![],
        ))
        .unwrap();
        assert!(tree.write(0).is_err(), "a name ustar cannot hold");
    }
}
