//! `ckf certs`: a development PKI for one indexer and its pools (rcgen, ECDSA P-256).
//!
//! Files written into `--out` (keys and tokens mode 0600, certificates 0644):
//!
//! | file | what | names |
//! | --- | --- | --- |
//! | `ca.crt`, `ca.key` | the development CA (every certificate below is signed by it) | CN `ckf-relay development CA (<domain>)` |
//! | `indexer.crt`, `indexer.key` | the indexer's server certificate (Relay + Query) | SANs: `--hosts` (IP addresses as IP SANs) |
//! | `producer-<dc>.crt`, `.key` | pool `<dc>`'s producer client certificate (mTLS toward the indexer) | SAN DNS and CN `producer.<dc>.<domain>` |
//! | `producer-<dc>-ingest.crt`, `.key` | pool `<dc>`'s producer Ingest server certificate | `--producer-hosts` with `{dc}` replaced, plus `producer.<dc>.<domain>` |
//! | `query.crt`, `query.key` | a query client's certificate (routers, `ckf query`) | SAN DNS and CN `query.<domain>` |
//! | `<dc>.token`, `query.token` | bearer tokens for deployments without mTLS: 32 random bytes, hex, one line | |
//!
//! Existing files are never overwritten without `--force`. `--reissue` re-issues every leaf
//! certificate from the existing `ca.crt` / `ca.key` and keeps the CA and the token files: the
//! rotation path (the services reload the new files on SIGHUP or when they notice the change).

use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SerialNumber,
};

/// Days every certificate is valid by default.
pub const DEFAULT_DAYS: u32 = 365;

/// `ckf certs`.
#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// Directory to write into (created when missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// DC ids of the pools, comma-separated: one producer client certificate, one Ingest
    /// server certificate and one token per pool.
    #[arg(long, value_name = "DC,...", value_delimiter = ',', required = true)]
    pub pools: Vec<String>,
    /// Name suffix of the identities: producer certificates name `producer.<dc>.<DOMAIN>`,
    /// the query client `query.<DOMAIN>`.
    #[arg(long, value_name = "DOMAIN", default_value = "ckf")]
    pub domain: String,
    /// Names of the indexer's server certificate (DNS names or IP addresses).
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        default_value = "indexer,localhost,127.0.0.1"
    )]
    pub hosts: Vec<String>,
    /// Names of each producer's Ingest server certificate; `{dc}` is replaced by the pool's
    /// DC id.
    #[arg(
        long,
        value_name = "NAME,...",
        value_delimiter = ',',
        default_value = "producer-{dc},localhost,127.0.0.1"
    )]
    pub producer_hosts: Vec<String>,
    /// Days the certificates are valid.
    #[arg(long, value_name = "DAYS", default_value_t = DEFAULT_DAYS)]
    pub days: u32,
    /// Overwrite existing files (a new CA: every service needs the new files).
    #[arg(long, conflicts_with = "reissue")]
    pub force: bool,
    /// Re-issue the leaf certificates from the existing ca.crt / ca.key in --out (new keys and
    /// serial numbers); the CA and the token files are kept.
    #[arg(long)]
    pub reissue: bool,
}

/// One file to write: name, contents, whether it is secret (mode 0600).
struct Output {
    name: String,
    contents: String,
    secret: bool,
}

/// Runs `ckf certs`: prints one line per file written.
///
/// # Errors
/// An existing file without `--force`, a bad name, `--reissue` without a readable CA, or an
/// I/O error, naming the file.
pub fn run(args: &CertsArgs) -> Result<()> {
    let outputs = plan(args)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    if !(args.force || args.reissue)
        && let Some(existing) = outputs
            .iter()
            .map(|o| args.out.join(&o.name))
            .find(|p| p.exists())
    {
        bail!(
            "{} exists: refusing to overwrite (--force replaces everything, --reissue \
                 re-issues the certificates from the existing CA)",
            existing.display()
        );
    }
    let mut written = Vec::with_capacity(outputs.len());
    for output in &outputs {
        let path = args.out.join(&output.name);
        write_file(&path, &output.contents, output.secret)?;
        written.push(path);
    }
    // Listed once every file is there: a reader closing standard output (`| head -1`) cannot
    // stop the command with half a set written.
    for path in written {
        crate::outln!("wrote {}", path.display())?;
    }
    Ok(())
}

/// Every file of `args`, generated in memory (nothing is written when anything fails).
fn plan(args: &CertsArgs) -> Result<Vec<Output>> {
    check_args(args)?;
    let mut outputs = Vec::new();
    let issuer = if args.reissue {
        load_ca(&args.out)?
    } else {
        let (issuer, cert_pem, key_pem) = new_ca(args)?;
        outputs.push(public("ca.crt", cert_pem));
        outputs.push(secret("ca.key", key_pem));
        issuer
    };
    let mut leaf = |stem: &str, names: &[String], cn: &str, usage: ExtendedKeyUsagePurpose| {
        let (cert, key) = issue(&issuer, names, cn, usage, args.days)
            .with_context(|| format!("issuing {stem}.crt"))?;
        outputs.push(public(&format!("{stem}.crt"), cert));
        outputs.push(secret(&format!("{stem}.key"), key));
        anyhow::Ok(())
    };
    leaf(
        "indexer",
        &args.hosts,
        &args.hosts[0],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    for dc in &args.pools {
        let identity = format!("producer.{dc}.{}", args.domain);
        leaf(
            &format!("producer-{dc}"),
            std::slice::from_ref(&identity),
            &identity,
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let mut hosts: Vec<String> = args
            .producer_hosts
            .iter()
            .map(|h| h.replace("{dc}", dc))
            .collect();
        if !hosts.contains(&identity) {
            hosts.push(identity.clone());
        }
        leaf(
            &format!("producer-{dc}-ingest"),
            &hosts,
            &identity,
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
    }
    let query = format!("query.{}", args.domain);
    leaf(
        "query",
        std::slice::from_ref(&query),
        &query,
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    if !args.reissue {
        for dc in &args.pools {
            outputs.push(secret(&format!("{dc}.token"), token()));
        }
        outputs.push(secret("query.token", token()));
    }
    Ok(outputs)
}

fn public(name: &str, contents: String) -> Output {
    Output {
        name: name.to_owned(),
        contents,
        secret: false,
    }
}

fn secret(name: &str, contents: String) -> Output {
    Output {
        name: name.to_owned(),
        contents,
        secret: true,
    }
}

/// DC ids and the domain become file and DNS names: keep them to DNS label characters.
fn check_args(args: &CertsArgs) -> Result<()> {
    let label = |what: &str, s: &str| {
        let ok = !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
            && !s.starts_with(['-', '.'])
            && !s.ends_with(['-', '.']);
        if ok {
            Ok(())
        } else if s.contains('_') {
            // A valid DC id, but not a DNS name: webpki refuses `_` in the names it matches.
            Err(anyhow::anyhow!(
                "{what} `{s}`: '_' is allowed in a DC id but not in the certificate DNS name \
                 it becomes (producer.{s}.<domain>); use '-' (e.g. `{}`), or issue this pool's \
                 certificate with your own CA and list its names in \
                 [[auth.producers]].cert_names",
                s.replace('_', "-")
            ))
        } else {
            Err(anyhow::anyhow!(
                "{what} `{s}`: must be 1..=63 characters of [A-Za-z0-9.-], not starting or \
                 ending with '-' or '.'"
            ))
        }
    };
    // A host is an IP address or a DNS name (a leading `*.` wildcard allowed): nothing else
    // may reach a certificate's SANs (a newline or space would make a name no client matches).
    let host = |what: &str, h: &str| -> Result<()> {
        if h.parse::<std::net::IpAddr>().is_ok() {
            return Ok(());
        }
        let name = h.strip_prefix("*.").unwrap_or(h).replace("{dc}", "dc");
        let ok = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            });
        if ok {
            Ok(())
        } else {
            Err(anyhow::anyhow!(
                "{what} {h:?}: not an IP address or DNS name (labels of [A-Za-z0-9-], \
                 separated by '.', an optional leading '*.')"
            ))
        }
    };
    label("--domain", &args.domain)?;
    if args.pools.is_empty() {
        bail!("--pools: at least one DC id is required");
    }
    for (i, dc) in args.pools.iter().enumerate() {
        label("--pools entry", dc)?;
        if args.pools[..i].contains(dc) {
            bail!("--pools: {dc} is listed twice");
        }
    }
    if args.hosts.is_empty() || args.hosts.iter().any(String::is_empty) {
        bail!("--hosts: give at least one non-empty name");
    }
    if args.producer_hosts.iter().any(String::is_empty) {
        bail!("--producer-hosts: names must be non-empty");
    }
    for h in &args.hosts {
        host("--hosts entry", h)?;
    }
    for h in &args.producer_hosts {
        host("--producer-hosts entry", h)?;
    }
    if args.days == 0 {
        bail!("--days must be at least 1");
    }
    Ok(())
}

/// A fresh CA: its issuer, certificate PEM and key PEM.
fn new_ca(args: &CertsArgs) -> Result<(Issuer<'static, KeyPair>, String, String)> {
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        format!("ckf-relay development CA ({})", args.domain),
    );
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params.serial_number = Some(serial());
    validity(&mut params, args.days);
    let cert = params.self_signed(&key).context("signing the CA")?;
    let (cert_pem, key_pem) = (cert.pem(), key.serialize_pem());
    Ok((Issuer::new(params, key), cert_pem, key_pem))
}

/// The existing CA of `dir` (`--reissue`).
fn load_ca(dir: &Path) -> Result<Issuer<'static, KeyPair>> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path).with_context(|| {
            format!(
                "--reissue needs the existing CA: cannot read {}",
                path.display()
            )
        })
    };
    let (cert, key) = (read("ca.crt")?, read("ca.key")?);
    let key = KeyPair::from_pem(&key)
        .with_context(|| format!("{}: not a PEM private key", dir.join("ca.key").display()))?;
    Issuer::from_ca_cert_pem(&cert, key).with_context(|| {
        format!(
            "{}: not a usable CA certificate",
            dir.join("ca.crt").display()
        )
    })
}

/// A leaf signed by `issuer`: certificate PEM and key PEM.
fn issue(
    issuer: &Issuer<'static, KeyPair>,
    names: &[String],
    common_name: &str,
    usage: ExtendedKeyUsagePurpose,
    days: u32,
) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .with_context(|| format!("`{n}` is not a DNS name or an IP address")),
        })
        .collect::<Result<_>>()?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.serial_number = Some(serial());
    validity(&mut params, days);
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Valid from an hour ago (clock skew between hosts) for `days` days.
fn validity(params: &mut CertificateParams, days: u32) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(i64::from(days));
}

/// A random positive 128-bit serial number (distinct for every re-issued certificate).
fn serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

/// 32 random bytes as 64 hex digits and a newline.
fn token() -> String {
    let bytes: [u8; 32] = rand::random();
    let mut hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    hex.push('\n');
    hex
}

/// Writes `path` (replacing it); secrets get mode 0600 from creation on.
fn write_file(path: &Path, contents: &str, secret: bool) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    let mut file = options
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    // An existing file keeps its mode on open: set it explicitly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = if secret { 0o600 } else { 0o644 };
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    }
    file.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: CertsArgs,
    }

    fn args(extra: &[&str]) -> CertsArgs {
        Wrap::try_parse_from(["certs"].iter().chain(extra))
            .unwrap()
            .args
    }

    fn names(path: &Path) -> Vec<String> {
        let pem = std::fs::read(path).unwrap();
        let der = ckf_svc_kit::tls::read_certificates("t", path).unwrap();
        assert!(!pem.is_empty());
        ckf_svc_kit::tls::cert_names(der[0].as_ref())
    }

    #[test]
    fn writes_the_pki_with_the_agreed_names_and_modes_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("certs");
        let out_arg = out.to_str().unwrap();
        run(&args(&["--out", out_arg, "--pools", "dc-a,dc-b"])).unwrap();
        assert_eq!(
            names(&out.join("producer-dc-a.crt")),
            vec!["producer.dc-a.ckf"]
        );
        assert_eq!(names(&out.join("query.crt")), vec!["query.ckf"]);
        assert_eq!(
            names(&out.join("indexer.crt")),
            vec!["indexer", "localhost"]
        );
        assert_eq!(
            names(&out.join("producer-dc-b-ingest.crt")),
            vec!["producer-dc-b", "localhost", "producer.dc-b.ckf"]
        );
        let token = std::fs::read_to_string(out.join("dc-a.token")).unwrap();
        assert_eq!(token.trim().len(), 64);
        assert!(token.trim().bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(
            token,
            std::fs::read_to_string(out.join("dc-b.token")).unwrap()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |name: &str| {
                std::fs::metadata(out.join(name))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777
            };
            for secret in [
                "ca.key",
                "indexer.key",
                "producer-dc-a.key",
                "query.token",
                "dc-b.token",
            ] {
                assert_eq!(mode(secret), 0o600, "{secret}");
            }
            assert_eq!(mode("indexer.crt"), 0o644);
        }
        // Each pair loads as a server identity (key matches certificate).
        let tls = ckf_svc_kit::tls::ServerTlsConfig {
            cert_file: Some(out.join("indexer.crt")),
            key_file: Some(out.join("indexer.key")),
            client_ca_file: Some(out.join("ca.crt")),
            ..Default::default()
        };
        assert!(
            ckf_svc_kit::tls::ServerTls::load(&tls, "tls")
                .unwrap()
                .is_some()
        );

        let err = run(&args(&["--out", out_arg, "--pools", "dc-a,dc-b"])).unwrap_err();
        assert!(err.to_string().contains("refusing to overwrite"), "{err}");

        // Re-issue: same CA and tokens, new leaf serials.
        let ca = std::fs::read(out.join("ca.crt")).unwrap();
        let leaf = std::fs::read(out.join("indexer.crt")).unwrap();
        run(&args(&[
            "--out",
            out_arg,
            "--pools",
            "dc-a,dc-b",
            "--reissue",
            "--hosts",
            "indexer-2",
        ]))
        .unwrap();
        assert_eq!(std::fs::read(out.join("ca.crt")).unwrap(), ca);
        assert_eq!(
            std::fs::read_to_string(out.join("dc-a.token")).unwrap(),
            token
        );
        assert_ne!(std::fs::read(out.join("indexer.crt")).unwrap(), leaf);
        assert_eq!(names(&out.join("indexer.crt")), vec!["indexer-2"]);
        let tls = ckf_svc_kit::tls::ServerTlsConfig {
            cert_file: Some(out.join("indexer.crt")),
            key_file: Some(out.join("indexer.key")),
            ..Default::default()
        };
        assert!(
            ckf_svc_kit::tls::ServerTls::load(&tls, "tls")
                .unwrap()
                .is_some()
        );

        // --force replaces everything, the CA too.
        run(&args(&["--out", out_arg, "--pools", "dc-a", "--force"])).unwrap();
        assert_ne!(std::fs::read(out.join("ca.crt")).unwrap(), ca);
    }

    #[test]
    fn bad_names_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x");
        let out_arg = out.to_str().unwrap();
        let err = run(&args(&["--out", out_arg, "--pools", "dc a"])).unwrap_err();
        assert!(err.to_string().contains("--pools entry `dc a`"), "{err}");
        let err = run(&args(&["--out", out_arg, "--pools", "dc_a"])).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("'_' is allowed in a DC id but not in the certificate DNS name")
                && text.contains("`dc-a`"),
            "{err}"
        );
        for bad in ["ckf\nindexer", "a b", "-x.ckf", "x..ckf"] {
            let hosts = format!("--hosts={bad}");
            let err = run(&args(&["--out", out_arg, "--pools", "a", &hosts])).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!(
                    "--hosts entry {bad:?}: not an IP address or DNS name"
                )),
                "{err}"
            );
        }
        let err = run(&args(&[
            "--out",
            out_arg,
            "--pools",
            "a",
            "--producer-hosts",
            "producer-{dc}\tx",
        ]))
        .unwrap_err();
        assert!(err.to_string().contains("--producer-hosts entry"), "{err}");
        let err = run(&args(&["--out", out_arg, "--pools", "a,a"])).unwrap_err();
        assert!(err.to_string().contains("listed twice"), "{err}");
        let err = run(&args(&["--out", out_arg, "--pools", "a", "--reissue"])).unwrap_err();
        assert!(
            err.to_string().contains("--reissue needs the existing CA"),
            "{err}"
        );
        assert!(!out.join("ca.crt").exists());
    }
}
