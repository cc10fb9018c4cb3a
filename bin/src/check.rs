//! `oci-secrets-store-csi-driver-provider check FILE...`: validates SecretProviderClass
//! manifests offline with the code a Mount runs (`provider::MountParameters::parse`), and
//! prints the files each would mount, or every error found.

use std::io::{Read, Write};
use std::process::ExitCode;

use clap::Parser;
use provider::MountParameters;
use serde_json::{Value, json};

/// Validate SecretProviderClass manifests offline (no network access).
#[derive(Debug, Parser)]
#[command(name = "oci-secrets-store-csi-driver-provider check")]
struct CheckArgs {
    /// SecretProviderClass YAML files (one or many documents, or a `kind: List`); `-` reads
    /// standard input.
    #[arg(required = true)]
    files: Vec<String>,
    /// The pod namespace to validate with (default: each object's metadata.namespace).
    #[arg(long)]
    namespace: Option<String>,
    /// The pod's service account, for `authType: workload` classes.
    #[arg(long, default_value = "default")]
    service_account: String,
    /// `text` or `json`.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    output: String,
    /// The provider's configuration file (its `--config`): classes are checked against
    /// its limits (`server.max_secrets_per_mount`, `server.max_files_per_mount`) and what
    /// its operator allows (`auth.allowed_types`, `auth.allowed_regions`), and each
    /// `authType: workload` class is told what serves it (`[auth.workload]`).
    #[arg(long)]
    config: Option<String>,
}

/// What the provider's configuration allows, for the checks.
struct Allowed {
    limits: provider::ParseLimits,
    types: Vec<provider::AuthType>,
    regions: Vec<String>,
    /// What serves `authType: workload` and with which audience, when a configuration
    /// was given.
    workload: Option<(String, String)>,
}

impl Allowed {
    fn load(config: Option<&str>) -> Result<Self, String> {
        let Some(path) = config else {
            let defaults = crate::config::Config::default();
            return Ok(Self {
                workload: None,
                ..Self::from(&defaults)
            });
        };
        let args = [
            "provider".to_owned(),
            "--config".to_owned(),
            path.to_owned(),
        ];
        let flags = crate::flags::Flags::parse_from_args(&args).map_err(|e| e.to_string())?;
        crate::config::Config::load(&flags, &std::collections::BTreeMap::new())
            .map(|c| Self::from(&c))
            .map_err(|e| e.to_string())
    }
}

impl From<&crate::config::Config> for Allowed {
    fn from(c: &crate::config::Config) -> Self {
        Self {
            limits: provider::ParseLimits {
                max_secrets: c.server.max_secrets_per_mount,
                max_files: c.server.max_files_per_mount,
            },
            types: c.auth.allowed_types.clone(),
            regions: c.auth.allowed_regions.clone(),
            workload: Some((c.auth.workload.describe(), c.auth.workload_audience.clone())),
        }
    }
}

/// One SecretProviderClass checked.
struct Report {
    source: String,
    name: String,
    namespace: String,
    files: Vec<Value>,
    errors: Vec<String>,
    /// Who a valid class's mounts are made as, when the configuration says.
    identity: Option<String>,
    /// Never fatal (a misspelt parameter is ignored, as the driver's own attributes are).
    warnings: Vec<String>,
}

/// Runs `check` (`args` starts with `check`); exit 0 when every class is valid, 1 when any
/// is not, 2 on usage errors.
pub(crate) fn main(args: &[String], stdin: &mut dyn Read, out: &mut dyn Write) -> ExitCode {
    let args = match CheckArgs::try_parse_from(args) {
        Ok(args) => args,
        Err(err) => {
            let code = if err.use_stderr() { 2 } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let allowed = match Allowed::load(args.config.as_deref()) {
        Ok(allowed) => allowed,
        Err(err) => {
            eprintln!("cannot read the provider's configuration: {err}");
            return ExitCode::from(2);
        }
    };
    let mut reports = Vec::new();
    for file in &args.files {
        let text = if file == "-" {
            let mut text = String::new();
            stdin.read_to_string(&mut text).map(|_| text)
        } else {
            std::fs::read_to_string(file)
        };
        let text = match text {
            Ok(text) => text,
            Err(err) => {
                eprintln!("cannot read {file}: {err}");
                return ExitCode::from(2);
            }
        };
        reports.extend(check_text(file, &text, &args, &allowed));
    }
    let valid = reports.iter().all(|r| r.errors.is_empty());
    let written = if args.output == "json" {
        let all: Vec<Value> = reports
            .iter()
            .map(|r| {
                let mut report = json!({
                    "source": r.source,
                    "name": r.name,
                    "namespace": r.namespace,
                    "valid": r.errors.is_empty(),
                    "files": r.files,
                    "errors": r.errors,
                    "warnings": r.warnings,
                });
                if let Some(identity) = &r.identity {
                    report["identity"] = json!(identity);
                }
                report
            })
            .collect();
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&all).unwrap_or_default()
        )
    } else {
        write_text(out, &reports)
    };
    if written.is_err() {
        return ExitCode::from(2);
    }
    if valid {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn write_text(out: &mut dyn Write, reports: &[Report]) -> std::io::Result<()> {
    for r in reports {
        if r.errors.is_empty() {
            let inputs = r.files.iter().filter(|f| f["written"] == false).count();
            let selections = r
                .files
                .iter()
                .filter(|f| f.get("selection").is_some())
                .count();
            let mut also = String::new();
            match selections {
                0 => {}
                1 => also.push_str(" and 1 selection"),
                n => also.push_str(&format!(" and {n} selections")),
            }
            if inputs > 0 {
                also.push_str(&format!(" and {inputs} read by templates only"));
            }
            let written = r.files.len() - inputs - selections;
            writeln!(
                out,
                "{}: {}/{}: valid, {written} file{}{also}",
                r.source,
                r.namespace,
                r.name,
                if written == 1 { "" } else { "s" }
            )?;
            if let Some(identity) = &r.identity {
                writeln!(out, "  identity: {identity}")?;
            }
            for f in &r.files {
                writeln!(out, "{}", file_line(f))?;
            }
        } else {
            writeln!(
                out,
                "{}: {}/{}: {} error{}",
                r.source,
                r.namespace,
                r.name,
                r.errors.len(),
                if r.errors.len() == 1 { "" } else { "s" }
            )?;
            for e in &r.errors {
                writeln!(out, "  {e}")?;
            }
        }
        for w in &r.warnings {
            writeln!(out, "  warning: {w}")?;
        }
    }
    Ok(())
}

/// One file of a valid class, as the text output lists it.
fn file_line(f: &Value) -> String {
    let text = |k: &str| f[k].as_str().unwrap_or("").to_owned();
    let mode = f["mode"]
        .as_str()
        .map_or_else(|| "(the driver's permission)".to_owned(), str::to_owned);
    let mut line = format!("  {}  {mode}  {}", text("path"), text("source"));
    for (k, label) in [("vault", "vault"), ("selector", ""), ("key", "key")] {
        let v = text(k);
        if !v.is_empty() {
            line.push_str(&if label.is_empty() {
                format!(", {v}")
            } else {
                format!(", {label} {v}")
            });
        }
    }
    line
}

fn check_text(source: &str, text: &str, args: &CheckArgs, allowed: &Allowed) -> Vec<Report> {
    let report = |name: &str, namespace: &str, error: String| Report {
        warnings: Vec::new(),
        source: source.to_owned(),
        name: name.to_owned(),
        namespace: namespace.to_owned(),
        files: Vec::new(),
        errors: vec![error],
        identity: None,
    };
    // Manifests are read within a budget like every document: a file of aliases cannot
    // take the checker's memory either.
    const MANIFESTS: bounded::ParseBudget = bounded::ParseBudget::new(16 * 1024 * 1024);
    let documents: Vec<Value> = match bounded::yaml::from_multiple::<Value>(text, &MANIFESTS, 4096)
    {
        Ok(docs) => docs,
        Err(err) => return vec![report("-", "-", err.detail())],
    };
    let mut objects = Vec::new();
    for doc in documents {
        match doc.get("kind").and_then(Value::as_str) {
            Some("List") | Some("SecretProviderClassList") => {
                objects.extend(
                    doc.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                );
            }
            _ if doc.is_null() => {}
            _ => objects.push(doc),
        }
    }
    if objects.is_empty() {
        return vec![report(
            "-",
            "-",
            "no SecretProviderClass in it: the input is empty or holds no object".to_owned(),
        )];
    }
    objects
        .iter()
        .map(|object| check_object(source, object, args, allowed))
        .collect()
}

/// One object: what a Mount would make of it (the class's first error and the files it
/// writes), plus the error of every entry on its own, so that all of them are reported.
fn check_object(source: &str, object: &Value, args: &CheckArgs, allowed: &Allowed) -> Report {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or("(no name)").to_owned();
    let namespace = args
        .namespace
        .clone()
        .or_else(|| metadata["namespace"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "default".to_owned());
    let mut r = Report {
        source: source.to_owned(),
        name,
        namespace: namespace.clone(),
        files: Vec::new(),
        errors: Vec::new(),
        identity: None,
        warnings: Vec::new(),
    };
    if object["kind"].as_str() != Some("SecretProviderClass") {
        r.errors.push(format!(
            "kind {:?} is not SecretProviderClass",
            object["kind"].as_str().unwrap_or("")
        ));
        return r;
    }
    if object["spec"]["provider"].as_str() != Some("oci") {
        r.errors.push(format!(
            "spec.provider {:?} is not oci",
            object["spec"]["provider"].as_str().unwrap_or("")
        ));
    }
    let attributes = string_parameters(&object["spec"]["parameters"], &mut r.errors);
    r.warnings = MountParameters::warnings(&attributes);
    let pod = csi_grpc::Pod {
        namespace: Some(namespace),
        name: Some("check".to_owned()),
        uid: Some("00000000-0000-0000-0000-000000000000".to_owned()),
        service_account: Some(args.service_account.clone()),
    };
    // The class as Mount parses it: every problem, in order.
    match MountParameters::parse_within(&attributes, &pod, allowed.limits) {
        Ok(params) => {
            r.errors.extend(provider_policy(&params, allowed));
            r.files = files_in_order(&params);
            if let (provider::AuthType::Workload, Some((mechanism, audience))) =
                (params.auth.auth_type(), &allowed.workload)
            {
                r.identity = Some(format!(
                    "service account {}/{} through {mechanism}, its token for audience {audience:?}",
                    pod.namespace.as_deref().unwrap_or(""),
                    args.service_account
                ));
            }
        }
        Err(err) => {
            r.errors.extend(err.problems().iter().cloned());
            let unlisted = err.count() - err.problems().len();
            if unlisted > 0 {
                r.errors.push(format!("and {unlisted} more problems"));
            }
        }
    }
    if !r.errors.is_empty() {
        r.files.clear();
    }
    r
}

/// `spec.parameters` as the driver passes them: strings only (Kubernetes refuses others).
fn string_parameters(
    parameters: &Value,
    errors: &mut Vec<String>,
) -> std::collections::BTreeMap<String, String> {
    let mut attributes = std::collections::BTreeMap::new();
    let Some(parameters) = parameters.as_object() else {
        errors.push("spec.parameters is missing".to_owned());
        return attributes;
    };
    for (key, value) in parameters {
        match value.as_str() {
            Some(v) => {
                attributes.insert(key.clone(), v.to_owned());
            }
            None => errors.push(format!(
                "spec.parameters.{key} is not a string (Kubernetes refuses it)"
            )),
        }
    }
    attributes
}

/// What the provider's own settings refuse: an auth type outside `auth.allowed_types`, a
/// region outside `auth.allowed_regions`.
fn provider_policy(params: &MountParameters, allowed: &Allowed) -> Vec<String> {
    let mut errors = Vec::new();
    let auth_type = params.auth.auth_type();
    if !allowed.types.contains(&auth_type) {
        let types: Vec<&str> = allowed.types.iter().map(|t| t.as_str()).collect();
        errors.push(format!(
            "authType \"{auth_type}\" is not allowed by the provider's auth.allowed_types [{}]",
            types.join(", ")
        ));
    }
    for (key, region) in [
        ("region", &params.region),
        ("failoverRegion", &params.failover_region),
    ] {
        if let Some(region) = region
            && !allowed.regions.is_empty()
            && !allowed.regions.contains(region)
        {
            errors.push(format!(
                "parameter {key:?} {region:?} is not among the provider's \
                 auth.allowed_regions ({})",
                allowed.regions.join(", ")
            ));
        }
    }
    errors
}

/// The files a mount writes, in the list's order, every kind alike (each entry says what
/// its files are: `provider::Entry::describe`).
fn files_in_order(params: &MountParameters) -> Vec<Value> {
    params
        .entries
        .iter()
        .flat_map(provider::Entry::describe)
        .map(|file| {
            let mode = match file.mode {
                Some(m) => Value::String(format!("{:04o}", m.get())),
                // `null` in JSON: the driver's `permission` (0644 unless the CSI volume says).
                None => Value::Null,
            };
            let mut line = json!({
                "path": file.path,
                "mode": mode,
                "source": file.source,
                "vault": file.vault,
                "selector": file.selector,
                "key": file.key,
                "encoding": file.encoding,
                "written": file.written,
            });
            if let Some(selection) = file.selection {
                line["selection"] = Value::String(selection);
            }
            line
        })
        .collect()
}
