use super::*;
use clap::{CommandFactory, Parser};

#[test]
fn cli_is_well_formed() {
    Cli::command().debug_assert();
}

#[test]
fn the_dashboard_gets_the_store_out_of_sight_of_ps() {
    let url = std::path::Path::new("postgresql://phyfarm:s3cret@db.example/results");
    let cmd = dashboard_command(std::path::Path::new("phyfarm-dashboard"), url, "serve", &[]);
    let args: Vec<_> = cmd
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(args, ["serve"]);
    let env: Vec<_> = cmd.get_envs().collect();
    assert_eq!(
        env,
        [(std::ffi::OsStr::new("PHYFARM_STORE"), Some(url.as_os_str()))]
    );
}

#[test]
fn unknown_variant_is_a_usage_error() {
    let err = Cli::try_parse_from(["phyfarm", "build", "--variant", "go"]).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(err.to_string().contains("invalid value 'go'"), "{err}");
}

#[test]
fn a_bad_device_is_a_usage_error() {
    for ok in ["emulated", "forwarded-gadget", "forwarded:127.0.0.1:4000"] {
        Cli::try_parse_from(["phyfarm", "test", "--artifacts", "o", "--device", ok]).unwrap();
    }
    for bad in [
        "gadget",
        "forwarded:host",
        "forwarded::4000",
        "forwarded:h:0",
    ] {
        let err = Cli::try_parse_from(["phyfarm", "test", "--artifacts", "o", "--device", bad])
            .unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
        assert!(err.to_string().contains("forwarded-gadget"), "{err}");
    }
}

#[test]
fn run_defaults_to_both_variants() {
    let cli = Cli::try_parse_from(["phyfarm", "run"]).unwrap();
    match cli.command {
        Command::Run(a) => assert_eq!(a.variants, [Variant::Rust, Variant::C]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn run_farm_guests_default_to_twice_the_cpus_plus_one() {
    assert_eq!(farm_workers(None), 2 * jobs(None) + 1);
    assert_eq!(farm_workers(Some(1)), 1);
    let cli = Cli::try_parse_from(["phyfarm", "run", "-n", "3"]).unwrap();
    match cli.command {
        Command::Run(a) => assert_eq!(a.workers, Some(3)),
        other => panic!("{other:?}"),
    }
    for bad in ["0", "x", "257"] {
        let err = Cli::try_parse_from(["phyfarm", "run", "-n", bad]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
        assert!(err.to_string().contains("--workers"), "{err}");
    }
}

#[test]
fn the_quick_selftest_keeps_the_full_selftests_store() {
    let cache = Path::new("/c");
    assert_eq!(selftest_out(cache, false, None), Path::new("/c/selftest"));
    assert_eq!(
        selftest_out(cache, true, None),
        Path::new("/c/selftest-quick")
    );
    let given = Some(PathBuf::from("/elsewhere"));
    assert_eq!(selftest_out(cache, true, given), Path::new("/elsewhere"));
}

#[test]
fn selftest_cases_run_two_at_a_time_unless_told() {
    let cli = Cli::try_parse_from(["phyfarm", "selftest", "--quick"]).unwrap();
    match cli.command {
        Command::Selftest(a) => assert_eq!(a.jobs, 2),
        other => panic!("{other:?}"),
    }
    let cli = Cli::try_parse_from(["phyfarm", "selftest", "-j", "1"]).unwrap();
    match cli.command {
        Command::Selftest(a) => assert_eq!(a.jobs, 1),
        other => panic!("{other:?}"),
    }
    for bad in ["0", "x", "17"] {
        let err = Cli::try_parse_from(["phyfarm", "selftest", "-j", bad]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
        assert!(err.to_string().contains("--jobs"), "{err}");
    }
}

#[test]
fn test_guests_are_counted_like_the_runs() {
    let cli = Cli::try_parse_from(["phyfarm", "test", "--artifacts", "x", "-n", "2"]).unwrap();
    match cli.command {
        Command::Test(a) => assert_eq!(a.workers, Some(2)),
        other => panic!("{other:?}"),
    }
    for bad in ["0", "x", "257"] {
        let err =
            Cli::try_parse_from(["phyfarm", "test", "--artifacts", "x", "-n", bad]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{bad}");
        assert!(err.to_string().contains("--workers"), "{err}");
    }
}
