//! Reserved for a short-lived, identity-keyed, single-flight cache of secret bundles.
//!
//! This crate is intentionally empty: credentials, the expensive part of a mount (token
//! exchanges, key parsing), are cached per identity inside `oci-csi-auth`, and secret
//! bundles are fetched on every mount so that rotations show on the driver's next poll.
//! ARCHITECTURE.md ("Caching of secret bundles") says when this would change.
