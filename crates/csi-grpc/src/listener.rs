use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where the provider listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:///path/to/socket` (or `unix:/path`): what the driver dials.
    Unix(PathBuf),
    /// `tcp://127.0.0.1:port`: loopback only, for debugging with ordinary gRPC tools.
    Tcp(SocketAddr),
}

/// Why an endpoint string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointParseError {
    /// Neither `unix://` nor `tcp://`.
    #[error("endpoint {0:?} must start with unix:// or tcp://")]
    Scheme(String),
    /// `unix://` without an absolute path.
    #[error(
        "endpoint {0:?} must name an absolute socket path, e.g. unix:///opt/provider/sockets/oci.sock"
    )]
    UnixPath(String),
    /// `tcp://` with something that is not `ip:port`.
    #[error("endpoint {0:?} must be tcp://IP:PORT")]
    TcpAddress(String),
    /// `tcp://` on a non-loopback address.
    #[error(
        "endpoint {0:?} is not a loopback address; the provider serves TCP only on loopback, for debugging"
    )]
    NotLoopback(String),
}

impl FromStr for Endpoint {
    type Err = EndpointParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(rest) = s.strip_prefix("unix:") {
            let path = rest.strip_prefix("//").unwrap_or(rest);
            if !path.starts_with('/') || path.len() < 2 {
                return Err(EndpointParseError::UnixPath(s.to_owned()));
            }
            Ok(Endpoint::Unix(PathBuf::from(path)))
        } else if let Some(rest) = s.strip_prefix("tcp://") {
            let addr: SocketAddr = rest
                .parse()
                .map_err(|_| EndpointParseError::TcpAddress(s.to_owned()))?;
            if !addr.ip().is_loopback() {
                return Err(EndpointParseError::NotLoopback(s.to_owned()));
            }
            Ok(Endpoint::Tcp(addr))
        } else {
            Err(EndpointParseError::Scheme(s.to_owned()))
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(path) => write!(f, "unix://{}", path.display()),
            Endpoint::Tcp(addr) => write!(f, "tcp://{addr}"),
        }
    }
}

/// Why the provider could not start listening.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// Something that is not a socket is in the way.
    #[error("{path} exists and is a {what}, not a socket; refusing to delete it")]
    NotASocket {
        /// The path.
        path: PathBuf,
        /// What is there.
        what: &'static str,
    },
    /// The socket's directory does not exist.
    #[error("the directory of {0} does not exist")]
    NoDirectory(PathBuf),
    /// An I/O error while preparing or binding.
    #[error("cannot {action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// On what.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A bound listener, ready to serve.
#[derive(Debug)]
pub struct Listener {
    pub(crate) kind: ListenerKind,
    /// The uids a Unix-socket peer may have (`None`: any the socket's mode lets in).
    pub(crate) allowed_peer_uids: Option<Vec<u32>>,
}

#[derive(Debug)]
pub(crate) enum ListenerKind {
    Unix {
        listener: tokio::net::UnixListener,
        path: PathBuf,
        identity: SocketIdentity,
    },
    Tcp(tokio::net::TcpListener),
}

impl Listener {
    /// Serves only Unix-socket peers whose uid (`SO_PEERCRED`, read once per accepted
    /// connection) is in `uids`; others are closed at accept with a warning naming the uid.
    /// Defence in depth beside the socket's mode. TCP endpoints (loopback debugging) are
    /// unaffected.
    pub fn allow_peer_uids(mut self, uids: Vec<u32>) -> Self {
        self.allowed_peer_uids = Some(uids);
        self
    }

    /// Binds `endpoint`. For a Unix socket, the socket is created in a fresh private
    /// directory (mode 0700) next to the path, given `permissions` there (whatever the
    /// umask), and moved onto the path with `rename(2)`: it is never reachable with other
    /// permissions, and it atomically takes the path over from an existing socket, live or
    /// stale. During a DaemonSet rolling update with `maxSurge` the new pod so takes over
    /// from the old one, which keeps serving the connections it accepted and, on exit,
    /// leaves the path alone because it is no longer its own. A regular file, directory or
    /// symbolic link at the path is left alone and reported.
    ///
    /// Must be called within a Tokio runtime.
    pub fn bind(endpoint: &Endpoint, permissions: u32) -> Result<Self, BindError> {
        match endpoint {
            Endpoint::Unix(path) => bind_unix(path, permissions),
            Endpoint::Tcp(addr) => {
                let std_listener =
                    std::net::TcpListener::bind(addr).map_err(|source| BindError::Io {
                        action: "bind",
                        path: addr.to_string(),
                        source,
                    })?;
                std_listener
                    .set_nonblocking(true)
                    .map_err(|source| BindError::Io {
                        action: "configure",
                        path: addr.to_string(),
                        source,
                    })?;
                let listener =
                    tokio::net::TcpListener::from_std(std_listener).map_err(|source| {
                        BindError::Io {
                            action: "register",
                            path: addr.to_string(),
                            source,
                        }
                    })?;
                Ok(Self {
                    kind: ListenerKind::Tcp(listener),
                    allowed_peer_uids: None,
                })
            }
        }
    }

    /// The endpoint actually bound (with the real port for `tcp://127.0.0.1:0`).
    pub fn local_endpoint(&self) -> Endpoint {
        match &self.kind {
            ListenerKind::Unix { path, .. } => Endpoint::Unix(path.clone()),
            ListenerKind::Tcp(listener) => match listener.local_addr() {
                Ok(addr) => Endpoint::Tcp(addr),
                // Only fails for a closed socket, which a bound listener is not.
                Err(_) => Endpoint::Tcp(SocketAddr::from(([127, 0, 0, 1], 0))),
            },
        }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> BindError {
    let path = path.display().to_string();
    move |source| BindError::Io {
        action,
        path,
        source,
    }
}

fn bind_unix(path: &Path, permissions: u32) -> Result<Listener, BindError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("/"),
    };
    if !dir.is_dir() {
        return Err(BindError::NoDirectory(path.to_owned()));
    }
    let replacing = match std::fs::symlink_metadata(path) {
        Ok(meta) => {
            let file_type = meta.file_type();
            if !file_type.is_socket() {
                let what = if file_type.is_dir() {
                    "directory"
                } else if file_type.is_symlink() {
                    "symbolic link"
                } else if file_type.is_file() {
                    "regular file"
                } else {
                    "special file"
                };
                return Err(BindError::NotASocket {
                    path: path.to_owned(),
                    what,
                });
            }
            true
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => false,
        Err(e) => return Err(io_err("inspect", path)(e)),
    };

    let private = PrivateDir::create(dir, path)?;
    let temporary = private.path.join("socket");
    let std_listener =
        std::os::unix::net::UnixListener::bind(&temporary).map_err(io_err("bind", &temporary))?;
    // Inside a directory only we can enter, chmod by path cannot be raced.
    std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(permissions))
        .map_err(io_err("set permissions of", &temporary))?;
    std::fs::rename(&temporary, path).map_err(io_err("move socket into place at", path))?;
    drop(private);
    if replacing {
        tracing::warn!(
            path = %path.display(),
            "took over the socket path from an earlier provider (a rolling update, or a crash); \
             it keeps the connections it accepted"
        );
    }
    let meta = std::fs::symlink_metadata(path).map_err(io_err("inspect", path))?;
    std_listener
        .set_nonblocking(true)
        .map_err(io_err("configure", path))?;
    let listener =
        tokio::net::UnixListener::from_std(std_listener).map_err(io_err("register", path))?;
    Ok(Listener {
        kind: ListenerKind::Unix {
            listener,
            path: path.to_owned(),
            identity: SocketIdentity::of(&meta),
        },
        allowed_peer_uids: None,
    })
}

/// A directory of our own (mode 0700) beside the socket path, removed with what is left in
/// it when dropped.
struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    fn create(dir: &Path, target: &Path) -> Result<Self, BindError> {
        use std::os::unix::fs::DirBuilderExt;
        use std::sync::atomic::{AtomicU32, Ordering};
        static COUNTER: AtomicU32 = AtomicU32::new(0);
        let name = target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "provider.sock".to_owned());
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        // mkdir fails if the name exists, so a name another user guessed and took only
        // costs another try; the directory we get is ours alone.
        for _ in 0..16 {
            let n = COUNTER.fetch_add(1, Ordering::Relaxed);
            let candidate = dir.join(format!(".{name}.{}.{nanos:08x}{n:04x}", std::process::id()));
            match std::fs::DirBuilder::new().mode(0o700).create(&candidate) {
                Ok(()) => return Ok(Self { path: candidate }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create a private directory in", dir)(e)),
            }
        }
        Err(BindError::Io {
            action: "create a private directory in",
            path: dir.display().to_string(),
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path.join("socket"));
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// What tells our socket file from a successor's at the same path: device and inode, plus
/// the change time, because a freed inode number is often reused at once for the next file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SocketIdentity {
    dev: u64,
    ino: u64,
    ctime: i64,
    ctime_nsec: i64,
}

impl SocketIdentity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
        }
    }
}

/// Removes the socket at `path` only if it is still the one we bound: during a rolling
/// update the next pod may already have bound the same path.
pub(crate) fn remove_own_socket(path: &Path, identity: SocketIdentity) {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if SocketIdentity::of(&meta) == identity => match std::fs::remove_file(path) {
            Ok(()) => tracing::info!(path = %path.display(), "removed socket"),
            Err(e) => tracing::warn!(path = %path.display(), error = %e, "cannot remove socket"),
        },
        Ok(_) => tracing::info!(
            path = %path.display(),
            "socket path now belongs to another process; leaving it"
        ),
        Err(_) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            "unix:///opt/provider/sockets/oci.sock"
                .parse::<Endpoint>()
                .unwrap(),
            Endpoint::Unix("/opt/provider/sockets/oci.sock".into())
        );
        assert_eq!(
            "unix:/tmp/x.sock".parse::<Endpoint>().unwrap(),
            Endpoint::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            "tcp://127.0.0.1:9000".parse::<Endpoint>().unwrap(),
            Endpoint::Tcp("127.0.0.1:9000".parse().unwrap())
        );
        assert!(matches!(
            "tcp://0.0.0.0:9000".parse::<Endpoint>(),
            Err(EndpointParseError::NotLoopback(_))
        ));
        assert!(matches!(
            "unix://relative.sock".parse::<Endpoint>(),
            Err(EndpointParseError::UnixPath(_))
        ));
        assert!(matches!(
            "/tmp/x.sock".parse::<Endpoint>(),
            Err(EndpointParseError::Scheme(_))
        ));
        assert!(matches!(
            "tcp://localhost".parse::<Endpoint>(),
            Err(EndpointParseError::TcpAddress(_))
        ));
    }
}
