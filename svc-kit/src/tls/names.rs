//! The names of a certificate (subject alternative names, common name) and of the verified
//! client certificate of a request, for authorization.

/// The names of a DER certificate: its DNS and URI subject alternative names, then its
/// subject common name(s), each once, in that order. Empty when the certificate does not parse.
pub fn cert_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = Vec::new();
    let mut push = |name: &str| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(dns) => push(dns),
                x509_parser::extensions::GeneralName::URI(uri) => push(uri),
                _ => {}
            }
        }
    }
    for cn in cert.subject().iter_common_name() {
        if let Ok(cn) = cn.as_str() {
            push(cn);
        }
    }
    names
}

/// The serial number of a DER certificate as lower-case hex bytes separated by `:` (as
/// the reload log lines print it); `None` when it does not parse.
pub fn cert_serial(der: &[u8]) -> Option<String> {
    x509_parser::parse_x509_certificate(der)
        .ok()
        .map(|(_, cert)| cert.raw_serial_as_string())
}

/// The names ([`cert_names`]) of the verified client certificate of `request`'s connection:
/// DNS and URI SANs and the subject CN of the leaf. Empty for a plaintext connection or a TLS
/// connection without a client certificate (`client_auth = "optional"`, or no client CA).
/// The certificate has been verified against `client_ca_file` in the handshake.
pub fn peer_names<T>(request: &tonic::Request<T>) -> Vec<String> {
    request
        .peer_certs()
        .and_then(|chain| chain.first().map(|leaf| cert_names(leaf.as_ref())))
        .unwrap_or_default()
}
