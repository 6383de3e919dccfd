//! `ckf_core::access` against a simple model: random policies (principals with tokens,
//! certificate names and pools) and random credentials; the model decides with plain sets what
//! the rules in the module docs say, and the policy must decide the same, naming the same
//! principal. Also: constant-time token comparison agrees with `==`, and a token file's text
//! round-trips.

use std::collections::BTreeSet;

use ckf_core::access::{
    AccessError, Credentials, Identity, Policy, PoolGrant, Principal, Scope, Secret, SourceGrant,
};
use ckf_core::identity::PoolId;
use proptest::prelude::*;

const DCS: usize = 4;
const CERTS: usize = 6;

/// One generated principal: token (by index), owned certificate names, pools.
#[derive(Debug, Clone)]
struct ModelPrincipal {
    token: Option<String>,
    certs: BTreeSet<String>,
    pools: BTreeSet<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Anonymous,
    Known(usize),
    Unauthenticated,
    Denied,
}

fn pool(dc: usize) -> PoolId {
    PoolId::new("d", &format!("dc{dc}")).unwrap()
}

fn arb_policy() -> impl Strategy<Value = (bool, Vec<ModelPrincipal>)> {
    (0usize..=4).prop_flat_map(|n| {
        (
            any::<bool>(),
            // Owner of each certificate name (>= n: nobody).
            prop::collection::vec(0usize..6, CERTS),
            prop::collection::vec(
                (any::<bool>(), prop::collection::vec(any::<bool>(), DCS)),
                n,
            ),
        )
            .prop_map(move |(required, owners, specs)| {
                let mut principals: Vec<ModelPrincipal> = specs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (has_token, member))| ModelPrincipal {
                        token: has_token.then(|| format!("tok{i}")),
                        certs: BTreeSet::new(),
                        pools: (0..DCS).filter(|&d| member[d]).collect(),
                    })
                    .collect();
                for (c, owner) in owners.into_iter().enumerate() {
                    if let Some(p) = principals.get_mut(owner) {
                        p.certs.insert(format!("c{c}"));
                    }
                }
                for (i, p) in principals.iter_mut().enumerate() {
                    if p.token.is_none() && p.certs.is_empty() {
                        p.token = Some(format!("tok{i}"));
                    }
                }
                // `required` without principals is refused by `Policy::new` (tested below).
                (required && !principals.is_empty(), principals)
            })
    })
}

fn arb_credentials() -> impl Strategy<Value = (Option<String>, BTreeSet<String>)> {
    (
        prop::option::of(prop_oneof![
            (0usize..6).prop_map(|k| format!("tok{k}")),
            Just("bogus".to_owned()),
        ]),
        prop::collection::btree_set(
            prop_oneof![
                (0..CERTS).prop_map(|c| format!("c{c}")),
                Just("x".to_owned())
            ],
            0..=3,
        ),
    )
}

/// The rules, with sets.
fn model(
    required: bool,
    principals: &[ModelPrincipal],
    bearer: Option<&str>,
    certs: &BTreeSet<String>,
) -> Expected {
    if !required && principals.is_empty() {
        return Expected::Anonymous;
    }
    let mut identified = BTreeSet::new();
    if let Some(token) = bearer {
        match principals
            .iter()
            .position(|p| p.token.as_deref() == Some(token))
        {
            Some(i) => {
                identified.insert(i);
            }
            None => return Expected::Unauthenticated,
        }
    }
    for (i, p) in principals.iter().enumerate() {
        if !p.certs.is_disjoint(certs) {
            identified.insert(i);
        }
    }
    match identified.len() {
        0 if required && certs.is_empty() => Expected::Unauthenticated,
        0 if required => Expected::Denied,
        0 => Expected::Anonymous,
        1 => Expected::Known(*identified.first().unwrap()),
        _ => Expected::Unauthenticated,
    }
}

fn principal(i: usize, p: &ModelPrincipal) -> Principal {
    Principal {
        name: format!("p{i}"),
        cert_names: p.certs.iter().cloned().collect(),
        token: p.token.as_ref().map(|t| Secret::new(t.as_bytes()).unwrap()),
    }
}

fn credentials(bearer: Option<&str>, certs: &BTreeSet<String>) -> Credentials {
    Credentials {
        cert_names: certs.iter().cloned().collect(),
        bearer: bearer.map(|t| Secret::new(t.as_bytes()).unwrap()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn attach_decisions_follow_the_model(
        (required, principals) in arb_policy(),
        (bearer, certs) in arb_credentials(),
        dc in 0..DCS,
    ) {
        let entries = principals
            .iter()
            .enumerate()
            .map(|(i, p)| (principal(i, p), PoolGrant { pools: p.pools.iter().map(|&d| pool(d)).collect() }))
            .collect();
        let policy = Policy::new(required, entries).unwrap();
        let creds = credentials(bearer.as_deref(), &certs);
        let expected = model(required, &principals, bearer.as_deref(), &certs);

        match (policy.identify(&creds), &expected) {
            (Ok(Identity::Anonymous), Expected::Anonymous) => {}
            (Ok(Identity::Known { principal, .. }), Expected::Known(i)) => {
                prop_assert_eq!(&principal.name, &format!("p{i}"));
            }
            (Err(AccessError::Unauthenticated(_)), Expected::Unauthenticated) => {}
            (Err(AccessError::PermissionDenied(_)), Expected::Denied) => {}
            (got, _) => prop_assert!(false, "identify: got {:?}, model {:?}", got, expected),
        }

        let attach = policy.authorize_attach(&creds, &pool(dc));
        let allowed = match expected {
            Expected::Anonymous => true,
            Expected::Known(i) => principals[i].pools.contains(&dc),
            Expected::Unauthenticated | Expected::Denied => false,
        };
        prop_assert_eq!(attach.is_ok(), allowed, "{:?} / {:?}", attach, expected);
        if let Err(e) = &attach {
            // A refusal is only ever one of the two codes, and an identified principal without
            // the pool is a permission problem, not an authentication problem.
            if matches!(expected, Expected::Known(_)) {
                prop_assert_eq!(e.code_label(), "permission_denied");
            }
        }
    }

    #[test]
    fn batches_follow_the_grant(
        sources in prop::option::of(prop::collection::btree_set(0u8..4, 0..=4)),
        workers in prop::option::of(prop::collection::btree_set(0u64..6, 0..=6)),
        source in 0u8..4,
        touched in prop::collection::vec(0u64..6, 0..8),
    ) {
        let grant = SourceGrant {
            source_ids: sources.clone().map_or(Scope::All, |s| Scope::Only(s.iter().map(|i| format!("s{i}")).collect())),
            workers: workers.clone().map_or(Scope::All, Scope::Only),
        };
        let p = Principal { name: "src".into(), cert_names: vec![], token: Some(Secret::new(b"t").unwrap()) };
        let policy = Policy::new(true, vec![(p, grant)]).unwrap();
        let identity = policy.identify(&credentials(Some("t"), &BTreeSet::new())).unwrap();
        let result = identity.authorize_batch(&format!("s{source}"), touched.iter().copied());
        let source_ok = sources.as_ref().is_none_or(|s| s.contains(&source));
        let workers_ok = workers.as_ref().is_none_or(|w| touched.iter().all(|t| w.contains(t)));
        prop_assert_eq!(result.is_ok(), source_ok && workers_ok, "{:?}", result);
        if !source_ok {
            let denied_source = matches!(
                result,
                Err(AccessError::PermissionDenied(ckf_core::access::Denied::Source { .. }))
            );
            prop_assert!(denied_source);
        }
    }

    #[test]
    fn constant_time_comparison_agrees_with_equality(
        a in prop::collection::vec(0x21u8..=0x7e, 1..40),
        b in prop::collection::vec(0x21u8..=0x7e, 1..40),
    ) {
        let secret = Secret::new(&a).unwrap();
        prop_assert_eq!(secret.matches(&b), a == b);
        prop_assert!(secret.matches(&a));
    }

    #[test]
    fn token_file_text_round_trips(
        token in prop::collection::vec(0x21u8..=0x7e, 1..100),
        before in "[ \t\n]{0,3}",
        after in "[ \t\r\n]{0,3}",
    ) {
        let text = format!("{before}{}{after}", String::from_utf8(token.clone()).unwrap());
        let secret = Secret::from_file_text(&text).unwrap();
        prop_assert_eq!(secret.expose(), &token[..]);
    }
}

#[test]
fn required_without_principals_is_refused() {
    assert!(Policy::<PoolGrant>::new(true, vec![]).is_err());
}
