use super::*;

fn source(source_ids: &[&str], workers: Vec<WorkerEntry>, token: PathBuf) -> SourceAuth {
    SourceAuth {
        name: "router-1".into(),
        cert_names: vec![],
        token_file: Some(token),
        source_ids: source_ids.iter().map(|&s| s.to_owned()).collect(),
        workers,
    }
}

#[test]
fn sections_are_checked_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("r.token");
    std::fs::write(&token, "tok.0123456789abc\n").unwrap();
    let cfg = |s: SourceAuth| IngestAuthConfig {
        required: true,
        sources: vec![s],
    };
    let ok = cfg(source(
        &["router-1"],
        vec![WorkerEntry::Id(7), WorkerEntry::Text("8".into())],
        token.clone(),
    ));
    validate(&ok, None).unwrap();
    let err = validate(
        &cfg(source(
            &["r"],
            vec![WorkerEntry::Text("seven".into())],
            token.clone(),
        )),
        None,
    )
    .unwrap_err();
    assert_eq!(err.key, "ingest_auth.sources[0].workers");
    let err = validate(
        &cfg(source(
            &["r"],
            vec![WorkerEntry::Text("*".into()), WorkerEntry::Id(1)],
            token.clone(),
        )),
        None,
    )
    .unwrap_err();
    assert!(err.rule.contains("stand alone"), "{err}");
    let err = validate(&cfg(source(&[""], vec![], token.clone())), None).unwrap_err();
    assert_eq!(err.key, "ingest_auth.sources[0].source_ids");
    // Source ids follow the rule of `KvEventBatch.source_id` (`ckf_core::identity`): no
    // control character, no id longer than 128 bytes.
    let err = validate(&cfg(source(&["router\n1"], vec![], token.clone())), None).unwrap_err();
    assert_eq!(err.key, "ingest_auth.sources[0].source_ids");
    assert!(err.rule.contains("U+000A"), "{err}");
    let long = "r".repeat(129);
    let err = validate(&cfg(source(&[&long], vec![], token.clone())), None).unwrap_err();
    assert!(err.rule.contains("at most 128"), "{err}");
    let missing = dir.path().join("nope.token");
    let err = validate(&IngestAuthConfig::default(), Some(&missing)).unwrap_err();
    assert_eq!(err.key, "indexer_token_file");
    assert!(err.value.contains("nope.token"), "{err}");
    let err = validate(
        &IngestAuthConfig {
            required: true,
            sources: vec![],
        },
        None,
    )
    .unwrap_err();
    assert_eq!(err.key, "ingest_auth.required");
}

#[test]
fn the_sections_load_from_toml_and_flags() {
    use clap::Parser;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("r.token");
    std::fs::write(&token, "tok.0123456789abc\n").unwrap();
    let file = dir.path().join("p.toml");
    std::fs::write(
        &file,
        format!(
            "[ingest_auth]\nrequired = true\n[[ingest_auth.sources]]\nname = \"r\"\n\
             token_file = {token:?}\nsource_ids = [\"*\"]\nworkers = [7, \"18446744073709551615\"]\n"
        ),
    )
    .unwrap();
    let args = [
        "ckf-producer",
        "--config",
        file.to_str().unwrap(),
        "--dc",
        "dc-a",
        "--indexer",
        "http://127.0.0.1:1",
        "--indexer-token-file",
        token.to_str().unwrap(),
    ];
    let config = crate::cli::Cli::parse_from(args).load().unwrap();
    assert!(config.ingest_auth.required);
    assert_eq!(
        config.ingest_auth.sources[0].workers,
        vec![
            WorkerEntry::Id(7),
            WorkerEntry::Text("18446744073709551615".into())
        ]
    );
    assert_eq!(config.indexer_token_file.as_deref(), Some(token.as_path()));
    let policy = policy(&config.ingest_auth).unwrap();
    assert_eq!(
        policy.entries()[0].1.workers,
        Scope::Only([7, u64::MAX].into())
    );
    // An unreadable token file is refused at load (exit 2), naming the key and the path.
    let missing = dir.path().join("missing.token");
    let mut bad = args;
    bad[8] = missing.to_str().unwrap();
    let text = crate::cli::Cli::parse_from(bad)
        .load()
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("indexer_token_file") && text.contains("missing.token"),
        "{text}"
    );
}
