//! Which crypto module the binary runs on, checked before anything else starts: the `fips`
//! build refuses to run unless AWS-LC's FIPS module is in FIPS mode (its power-on self tests
//! passed) and TLS uses only FIPS-approved algorithms.

/// The module in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Module {
    /// AWS-LC's FIPS module, in FIPS mode (the `fips` build).
    pub(crate) fips: bool,
    /// What the start-up log line names.
    pub(crate) name: &'static str,
}

/// Why the `fips` build refuses to start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CryptoError {
    #[error(
        "this is the FIPS build, but AWS-LC's FIPS module is not in FIPS mode ({0}): its \
         self-tests failed or another AWS-LC is linked; refusing to start"
    )]
    NotInFipsMode(String),
    #[error(
        "this is the FIPS build, but the TLS crypto provider offers algorithms FIPS does not \
         approve; refusing to start"
    )]
    TlsNotFips,
}

/// The module this binary runs on, or why the FIPS build must not start.
pub(crate) fn check() -> Result<Module, CryptoError> {
    verify(
        cfg!(feature = "fips"),
        aws_lc_rs::try_fips_mode().map_err(str::to_owned),
        transport::crypto_provider().fips(),
    )
}

fn verify(
    fips_build: bool,
    fips_mode: Result<(), String>,
    tls_fips: bool,
) -> Result<Module, CryptoError> {
    if !fips_build {
        return Ok(Module {
            fips: false,
            name: "AWS-LC (aws-lc-sys)",
        });
    }
    fips_mode.map_err(CryptoError::NotInFipsMode)?;
    if !tls_fips {
        return Err(CryptoError::TlsNotFips);
    }
    Ok(Module {
        fips: true,
        name: "AWS-LC FIPS module (aws-lc-fips-sys)",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fips_build_refuses_a_module_out_of_fips_mode_or_a_tls_provider_that_is_not() {
        let err = verify(true, Err("FIPS mode not enabled!".to_owned()), true).unwrap_err();
        assert!(
            err.to_string()
                .contains("not in FIPS mode (FIPS mode not enabled!)")
                && err.to_string().contains("refusing to start"),
            "{err}"
        );
        assert!(matches!(
            verify(true, Ok(()), false),
            Err(CryptoError::TlsNotFips)
        ));
        assert!(verify(true, Ok(()), true).unwrap().fips);
        // The default build runs on plain AWS-LC whatever FIPS mode says.
        let plain = verify(false, Err("no".to_owned()), false).unwrap();
        assert_eq!(plain.name, "AWS-LC (aws-lc-sys)");
    }

    /// What this build really runs on: the FIPS build passes its own check.
    #[test]
    fn this_build_passes_its_own_check() {
        let module = check().unwrap();
        assert_eq!(module.fips, cfg!(feature = "fips"));
        assert_eq!(transport::crypto_provider().fips(), cfg!(feature = "fips"));
    }
}
