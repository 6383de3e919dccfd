//! Unit tests of the access rules: identification, grants, gates and refusal messages.

use super::*;

fn secret(s: &str) -> Secret {
    Secret::new(s.as_bytes()).unwrap()
}

fn principal(name: &str, certs: &[&str], token: Option<&str>) -> Principal {
    Principal {
        name: name.into(),
        cert_names: certs.iter().map(|&c| c.to_owned()).collect(),
        token: token.map(secret),
    }
}

fn pools(dcs: &[&str]) -> PoolGrant {
    PoolGrant {
        pools: dcs.iter().map(|dc| PoolId::new("d", dc).unwrap()).collect(),
    }
}

fn creds(certs: &[&str], token: Option<&str>) -> Credentials {
    Credentials {
        cert_names: certs.iter().map(|&c| c.to_owned()).collect(),
        bearer: token.map(secret),
    }
}

fn relay(required: bool) -> Policy<PoolGrant> {
    Policy::new(
        required,
        vec![
            (
                principal("dc-a", &["producer.dc-a.ckf"], Some("tok-a")),
                pools(&["dc-a"]),
            ),
            (principal("dc-b", &[], Some("tok-b")), pools(&["dc-b"])),
        ],
    )
    .unwrap()
}

#[test]
fn token_files_are_one_trimmed_printable_line() {
    assert_eq!(Secret::from_file_text("  abc\n").unwrap().expose(), b"abc");
    assert_eq!(
        Secret::from_file_text("\n\n").unwrap_err(),
        SecretError::Empty
    );
    assert_eq!(
        Secret::from_file_text("a\nb\n").unwrap_err(),
        SecretError::SeveralLines { lines: 2 }
    );
    assert_eq!(
        Secret::from_file_text("a b").unwrap_err(),
        SecretError::BadByte { position: 1 }
    );
    assert!(matches!(
        Secret::from_file_text(&"x".repeat(MAX_SECRET_BYTES + 1)),
        Err(SecretError::TooLong { .. })
    ));
    assert_eq!(format!("{:?}", secret("hunter2")), "Secret(7 bytes)");
}

#[test]
fn bearer_values_parse_strictly() {
    let c = Credentials::from_parts(Some(b"Bearer tok-a"), vec![]).unwrap();
    assert_eq!(c.bearer.unwrap().expose(), b"tok-a");
    let c = Credentials::from_parts(Some(b"bearer tok-a"), vec![]).unwrap();
    assert_eq!(c.bearer.unwrap().expose(), b"tok-a");
    let bad_values: [&[u8]; 5] = [
        b"tok-a",
        b"Basic abc",
        b"Bearer ",
        b"Bearer a b",
        b"Bearer \x01",
    ];
    for bad in bad_values {
        assert_eq!(
            Credentials::from_parts(Some(bad), vec![]).unwrap_err(),
            AccessError::Unauthenticated(Unauthenticated::MalformedAuthorization),
            "{bad:?}"
        );
    }
    assert!(Credentials::from_parts(None, vec![]).unwrap().is_empty());
}

#[test]
fn attach_decisions_name_the_principal_and_the_pool() {
    let policy = relay(true);
    let dc_a = PoolId::new("d", "dc-a").unwrap();
    let by_token = policy
        .authorize_attach(&creds(&[], Some("tok-a")), &dc_a)
        .unwrap();
    assert_eq!(by_token.name(), "dc-a");
    let by_cert = policy
        .authorize_attach(&creds(&["producer.dc-a.ckf", "other"], None), &dc_a)
        .unwrap();
    assert_eq!(by_cert.name(), "dc-a");

    let err = policy
        .authorize_attach(&creds(&[], None), &dc_a)
        .unwrap_err();
    assert_eq!(err.code_label(), "unauthenticated");
    let err = policy
        .authorize_attach(&creds(&[], Some("tok-b")), &dc_a)
        .unwrap_err();
    assert_eq!(err.code_label(), "permission_denied");
    let text = err.to_string();
    assert!(
        text.contains("\"dc-b\"") && text.contains("d/dc-a"),
        "{text}"
    );
    assert!(text.contains("it may publish: d/dc-b"), "{text}");
    let err = policy
        .authorize_attach(&creds(&[], Some("nope")), &dc_a)
        .unwrap_err();
    assert_eq!(
        err,
        AccessError::Unauthenticated(Unauthenticated::UnknownToken)
    );
    let err = policy
        .authorize_attach(&creds(&["stranger"], None), &dc_a)
        .unwrap_err();
    assert!(matches!(
        err,
        AccessError::PermissionDenied(Denied::UnmappedCertificate { .. })
    ));
    // Certificate of dc-a with dc-b's token: contradictory credentials.
    let err = policy
        .authorize_attach(&creds(&["producer.dc-a.ckf"], Some("tok-b")), &dc_a)
        .unwrap_err();
    assert!(matches!(
        err,
        AccessError::Unauthenticated(Unauthenticated::Conflict { .. })
    ));
}

#[test]
fn not_required_admits_anonymous_but_holds_principals_to_their_grants() {
    let policy = relay(false);
    let dc_a = PoolId::new("d", "dc-a").unwrap();
    assert!(matches!(
        policy.authorize_attach(&creds(&[], None), &dc_a),
        Ok(Identity::Anonymous)
    ));
    assert!(matches!(
        policy.authorize_attach(&creds(&["stranger"], None), &dc_a),
        Ok(Identity::Anonymous)
    ));
    assert!(
        policy
            .authorize_attach(&creds(&[], Some("tok-b")), &dc_a)
            .is_err()
    );
    assert!(
        policy
            .authorize_attach(&creds(&[], Some("nope")), &dc_a)
            .is_err()
    );
    // Off: credentials ignored.
    let off = Policy::<PoolGrant>::off();
    assert!(
        off.authorize_attach(&creds(&[], Some("nope")), &dc_a)
            .is_ok()
    );
}

#[test]
fn ambiguous_policies_are_refused() {
    let g = || pools(&["dc-a"]);
    assert_eq!(
        Policy::<PoolGrant>::new(true, vec![]).unwrap_err(),
        PolicyError::RequiredWithoutPrincipals
    );
    let err = Policy::new(false, vec![(principal("a", &[], None), g())]).unwrap_err();
    assert!(matches!(err, PolicyError::NoCredential { .. }));
    let err = Policy::new(
        false,
        vec![
            (principal("a", &[], Some("t")), g()),
            (principal("b", &[], Some("t")), g()),
        ],
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::SharedToken { .. }));
    let err = Policy::new(
        false,
        vec![
            (principal("a", &["n"], None), g()),
            (principal("b", &["n"], None), g()),
        ],
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::SharedCertName { .. }));
    let err = Policy::new(
        false,
        vec![
            (principal("a", &["x"], None), g()),
            (principal("a", &["y"], None), g()),
        ],
    )
    .unwrap_err();
    assert!(matches!(err, PolicyError::DuplicateName { .. }));
}

#[test]
fn batches_are_held_to_sources_and_workers() {
    let grant = SourceGrant {
        source_ids: Scope::Only(["router-1".to_owned()].into()),
        workers: Scope::Only([1, 2].into()),
    };
    let all = SourceGrant {
        source_ids: Scope::All,
        workers: Scope::All,
    };
    let policy = Policy::new(
        true,
        vec![
            (principal("r1", &[], Some("t1")), grant),
            (principal("admin", &[], Some("t2")), all),
        ],
    )
    .unwrap();
    let r1 = policy.identify(&creds(&[], Some("t1"))).unwrap();
    r1.authorize_batch("router-1", [1, 2, 1]).unwrap();
    let err = r1.authorize_batch("router-2", [1]).unwrap_err();
    assert!(err.to_string().contains("source \"router-2\""), "{err}");
    let err = r1.authorize_batch("router-1", [1, 9]).unwrap_err();
    assert_eq!(
        err,
        AccessError::PermissionDenied(Denied::Worker {
            principal: "r1".into(),
            source_id: "router-1".into(),
            event: 1,
            worker_id: 9
        })
    );
    // A load report: the same grant, refused in its own words.
    r1.authorize_load("router-1", 2).unwrap();
    let err = r1.authorize_load("router-1", 9).unwrap_err();
    assert_eq!(
        err,
        AccessError::PermissionDenied(Denied::LoadWorker {
            principal: "r1".into(),
            source_id: "router-1".into(),
            worker_id: 9
        })
    );
    assert!(
        err.to_string()
            .contains("may not report the load of worker 9"),
        "{err}"
    );
    assert!(matches!(
        r1.authorize_load("router-2", 1).unwrap_err(),
        AccessError::PermissionDenied(Denied::Source { .. })
    ));
    let admin = policy.identify(&creds(&[], Some("t2"))).unwrap();
    admin.authorize_batch("anything", [u64::MAX]).unwrap();
    admin.authorize_load("anything", u64::MAX).unwrap();
    // Reading a source's sequence: the source ids it may publish as, workers aside.
    r1.authorize_source_read("router-1").unwrap();
    assert_eq!(
        r1.authorize_source_read("router-2").unwrap_err(),
        AccessError::PermissionDenied(Denied::SourceRead {
            principal: "r1".into(),
            source_id: "router-2".into(),
        })
    );
    admin.authorize_source_read("anything").unwrap();
    let open = Policy::<SourceGrant>::new(false, vec![]).unwrap();
    let anonymous = open.identify(&creds(&[], None)).unwrap();
    anonymous.authorize_source_read("any").unwrap();
}

#[test]
fn token_gate() {
    let gate = TokenGate::new(Some(secret("q")));
    gate.check(&creds(&[], Some("q"))).unwrap();
    assert_eq!(
        gate.check(&creds(&["cert"], None)).unwrap_err(),
        AccessError::Unauthenticated(Unauthenticated::NoBearerToken)
    );
    assert!(
        !Unauthenticated::NoBearerToken
            .to_string()
            .contains("present a client certificate")
    );
    assert_eq!(
        gate.check(&creds(&["cert"], Some("qq"))).unwrap_err(),
        AccessError::Unauthenticated(Unauthenticated::UnknownToken)
    );
    TokenGate::default().check(&creds(&[], None)).unwrap();
}
