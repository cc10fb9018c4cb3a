//! Integration tests of `oci-csi-auth`: one binary (STYLE.md), one module per area.

mod ahead;
mod federation;
mod keys;
mod layer;
mod principals;
mod refusals;
mod vectors;

/// Reads a fixture from `tests/data/`.
fn fixture(name: &str) -> Vec<u8> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()))
}

/// The passphrase every encrypted fixture was written with.
const PASSPHRASE: &[u8] = b"correct horse battery staple";

/// The throw-away key of spec section 1.5.
const SPEC_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----
MIIEpAIBAAKCAQEA0zQ34yYniTDGSEuhySc7Ujyg0X08y6TeX/LbKaFXEik57Ze8
XQud3ONKuuGKZ/KU5ez7KIqV2LsjdEnVTfcnmFBdOiW3aGMI8tt0dWW2PXLocrbC
cz7vePN6XwZvAstEv7UJ2mMRek6jQMrq2kUhj0lq1eVTZj1cQeICsLjtYUznKAZi
56415PaQTL/c5pwdetBbiMhn9tK/pCig6PhT74hJUTyyYG7bqvPQ/H2jiRJi/pYa
6tJNL37v4VFrFbU5bg1bIU2PtuvcQsHbx3HsjMTVZD0knQ94aW3x7TP1atwFSyor
xCzNGeTJ7g3cNVabbuDZkSznCOW6GPIDQx8LtQIDAQABAoIBAAUqes94iHEHm2H7
T5q+9el+CCT3njwQ7UuFgizTgHC2R29zTa0s8pCLkrFdgOgn+9Jf6IjGUwH5GdXn
VGtSx0ondRBOCd1oxrhB++g/M6TvIZZkt/7fpDXeJrkaTC7ST/0sbXBFChFmyQF1
tSbfmAGMNyvCLzcJ+y61W4F9FHlTv9eghNG632xMh6CDf1AYjCxyd+dHYh03X8b4
/gM8KpaVMkqZsoACyr+94+7XPNw8lqDj7lkmHZ07TaNzz6wk0PWWd7cWBSmR0ee9
ONV3S2A+BxDWhKsUdveBKZgdOei8dWuGN36ktXWZ+vSK5HW5RlyjG9KQn6ulcBVB
1xXeaUECgYEA6bfWQK8Ml4GRbplM+rgZpcVF/LNb558+/h/iUquPDzH8bBLOsDD7
ovyDSPvD3K02GvDk9mD3tjjvC/VGXaM8OSR54pRNfriqKUWJUNqiAlFbkNt/GVtZ
HhrIJslAJNfREsve5F/diVJCRIMAnVr8e1t1BMhRx9K5ZUJeWfPGIXECgYEA51bl
zTiFU8fart6MTbmhkPFTYKF5sZgEqk4DZLir5FJDD5T9PnBmzZjHJBK+nZSP91QH
0nCMDgtWGXXz4EJTIrfcZ9p/TtzhzZHhu9fe87p36TT3S64gtLPgjCya25mIIKdG
9sPwERrtprZLh0IzJQpnIGAFZ6wssaxEtu5UbIUCgYAlhR6/KZry45kOUUv7X/y2
ERJoO/8AEx+Quluh++qufM7SJr7JqENtae5FlC1gSupJruyC5RQ/S6qMl+ag96ie
X821YyuBsXGXyJL/yOmDR75UZfhkgLawz4ncOCi1AXSN+O6iaQVumycKSqGZoVax
EwCZMPN4Ccs7h0kQVcMz8QKBgQDPLHgiQCLOs+U4w578oGh7iFM174YvMEfFSJYr
ZmKx16Ws162vdDPsnYyB1rOUJY6EXWGf6SDUFvzlUke0J1GSfvvImdl3A8LIOYPh
mGJW/UATvlZVFTy+93P5tJx+W1GYhJW9uh1NBEOeEBU1rWhmHJncWYGdpYhlGTR0
ap16jQKBgQCVvSVPgvKKHugf8mlur7n0UkV86aLlDH4e219hIPF2ct2O1oFP6yz3
SO11aqiEi7wpuLNn6uVlwdMCFZsyPptj5IefShFlKyZjU6xgtCRV2EMBMZ2OajoA
Izqt5jt6ORjOeYqbVHVmtHp0m1sVqs264smxU2cR8SxBjcgQv69cQA==
-----END RSA PRIVATE KEY-----
";

/// The instant all spec 1.5 vectors are dated.
fn spec_date() -> std::time::SystemTime {
    httpdate::parse_http_date("Thu, 05 Jan 2023 21:31:40 GMT").unwrap()
}
