use std::collections::BTreeSet;
use std::fmt;

/// Longest path the driver accepts, in bytes.
const MAX_PATH_BYTES: usize = 4096;
/// Longest path element the driver accepts, in bytes.
const MAX_ELEMENT_BYTES: usize = 255;

/// A relative file path that the Secrets Store CSI driver will accept.
///
/// The driver validates every returned path before it writes anything and fails the whole
/// mount otherwise (its `validatePath` and the kubelet atomic writer). Checking here, with a
/// message naming the rule, turns an opaque driver error into a specific one:
/// non-empty, relative, already in cleaned form (no `.` or empty elements, no trailing
/// `/`), no `..` element, a first element not starting with `..` (the atomic writer keeps
/// its `..data` and `..timestamp` entries there), no NUL byte, elements of at most 255
/// bytes and at most 4096 bytes in all.
///
/// ```
/// use secrets_store_csi_grpc::FilePath;
/// assert!(FilePath::new("db/password").is_ok());
/// assert!(FilePath::new("../etc/passwd").is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FilePath(String);

/// Why a path would be refused by the driver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("file path {} {reason}", bounded::quote(path))]
pub struct PathError {
    path: String,
    reason: PathRule,
}

impl PathError {
    /// The offending path.
    pub fn path(&self) -> &str {
        &self.path
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PathRule {
    Empty,
    Nul,
    Absolute,
    TooLong(usize),
    ElementTooLong(usize),
    NotClean,
    ParentElement,
    ReservedPrefix,
    Duplicate,
    FileIsDirectory(String),
}

impl fmt::Display for PathRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathRule::Empty => f.write_str("is empty"),
            PathRule::Nul => f.write_str("contains a NUL byte"),
            PathRule::Absolute => f.write_str("is absolute; it must be relative to the mount"),
            PathRule::TooLong(n) => write!(
                f,
                "is {n} bytes long; the driver accepts at most {MAX_PATH_BYTES}"
            ),
            PathRule::ElementTooLong(n) => write!(
                f,
                "has an element of {n} bytes; the driver accepts at most {MAX_ELEMENT_BYTES}"
            ),
            PathRule::NotClean => {
                f.write_str("is not in clean form (no empty or \".\" elements, no trailing \"/\")")
            }
            PathRule::ParentElement => f.write_str("has a \"..\" element"),
            PathRule::ReservedPrefix => {
                f.write_str("starts with \"..\", which the driver reserves for its atomic writer")
            }
            PathRule::Duplicate => f.write_str("is returned twice"),
            PathRule::FileIsDirectory(child) => {
                write!(
                    f,
                    "is a file but also the directory of {}",
                    bounded::quote(child)
                )
            }
        }
    }
}

impl FilePath {
    /// Validates `path` against the driver's rules.
    pub fn new(path: impl Into<String>) -> Result<Self, PathError> {
        let path = path.into();
        match check(&path) {
            Ok(()) => Ok(Self(path)),
            Err(reason) => Err(PathError { path, reason }),
        }
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FilePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for FilePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

fn check(path: &str) -> Result<(), PathRule> {
    if path.is_empty() {
        return Err(PathRule::Empty);
    }
    if path.contains('\0') {
        return Err(PathRule::Nul);
    }
    if path.starts_with('/') {
        return Err(PathRule::Absolute);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathRule::TooLong(path.len()));
    }
    for element in path.split('/') {
        match element {
            "" | "." => return Err(PathRule::NotClean),
            ".." => return Err(PathRule::ParentElement),
            e if e.len() > MAX_ELEMENT_BYTES => return Err(PathRule::ElementTooLong(e.len())),
            _ => {}
        }
    }
    if path.starts_with("..") {
        return Err(PathRule::ReservedPrefix);
    }
    Ok(())
}

/// Checks that a set of paths can be written together: no path twice, and no path that is
/// also the parent directory of another (`a` and `a/b`).
pub fn validate_file_set<'a>(
    paths: impl IntoIterator<Item = &'a FilePath>,
) -> Result<(), PathError> {
    let mut seen = BTreeSet::new();
    for path in paths {
        if !seen.insert(path.as_str()) {
            return Err(PathError {
                path: path.0.clone(),
                reason: PathRule::Duplicate,
            });
        }
    }
    for path in &seen {
        let mut prefix_end = 0;
        while let Some(i) = path[prefix_end..].find('/') {
            let parent = &path[..prefix_end + i];
            if seen.contains(parent) {
                return Err(PathError {
                    path: parent.to_owned(),
                    reason: PathRule::FileIsDirectory((*path).to_owned()),
                });
            }
            prefix_end += i + 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_paths_the_driver_accepts() {
        for ok in [
            "a",
            "a/b",
            "db-password",
            ".hidden",
            "a..b",
            "a/..b",
            "x".repeat(255).as_str(),
        ] {
            assert!(FilePath::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn refuses_each_rule_with_its_reason() {
        let long_element = "x".repeat(256);
        let long_path = vec!["x".repeat(200); 21].join("/");
        let cases: &[(&str, &str)] = &[
            ("", "is empty"),
            ("a\0b", "NUL"),
            ("/etc/passwd", "absolute"),
            (&long_path, "at most 4096"),
            (&long_element, "at most 255"),
            ("a//b", "clean form"),
            ("a/", "clean form"),
            ("./a", "clean form"),
            ("a/./b", "clean form"),
            ("..", "\"..\" element"),
            ("a/../b", "\"..\" element"),
            ("..data", "reserves"),
        ];
        for (path, fragment) in cases {
            let err = FilePath::new(*path).expect_err(path);
            assert!(err.to_string().contains(fragment), "{path:?}: {err}");
        }
    }

    #[test]
    fn refuses_duplicates_and_files_that_are_directories() {
        let p = |s: &str| FilePath::new(s).unwrap();
        assert!(validate_file_set(&[p("a"), p("b/c"), p("b/d")]).is_ok());
        let dup = validate_file_set(&[p("a"), p("a")]).unwrap_err();
        assert!(dup.to_string().contains("twice"), "{dup}");
        let dir = validate_file_set(&[p("a/b/c"), p("a/b")]).unwrap_err();
        assert_eq!(dir.path(), "a/b");
        assert!(dir.to_string().contains("directory of \"a/b/c\""), "{dir}");
    }
}
