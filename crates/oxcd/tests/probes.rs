//! /livez and /readyz as etcd 3.5.16 answers them (checked against it:
//! bodies, headers, `?verbose`, `?exclude`, the per-check paths, 405). The
//! no-leader case is in http.rs, beside /health's.

use testkit::http;
use testkit::Process;

#[test]
fn livez_and_readyz_answer_as_etcd_3_5_16() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = testkit::free_port();
    let metrics_url = format!("http://127.0.0.1:{metrics_port}");
    let oxcd = Process::start_oxcd(
        &testkit::oxcd_bin(),
        dir.path(),
        &["--listen-metrics-urls", &metrics_url],
    );
    let endpoint = oxcd.endpoint.clone();

    for path in [
        "/livez",
        "/readyz",
        "/livez/serializable_read",
        "/readyz/linearizable_read",
        "/readyz/data_corruption",
    ] {
        for base in [&endpoint, &metrics_url] {
            let response = http::get(base, path).unwrap();
            assert_eq!(response.status, 200, "{base}{path}: {}", response.body);
            assert_eq!(response.body, "ok\n", "{path}");
            assert_eq!(
                response.header("content-type"),
                Some("text/plain; charset=utf-8")
            );
            assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
            // etcd's access controller is on the client URLs only
            let cors = (base == &endpoint).then_some("*");
            assert_eq!(response.header("access-control-allow-origin"), cors);
        }
    }
    let verbose = http::get(&endpoint, "/livez?verbose").unwrap();
    assert_eq!(verbose.body, "[+]serializable_read ok\nok\n");
    let verbose = http::get(&endpoint, "/readyz?verbose=1").unwrap();
    let mut lines: Vec<&str> = verbose.body.lines().collect();
    assert_eq!(lines.pop(), Some("ok"), "{}", verbose.body);
    lines.sort_unstable();
    assert_eq!(
        lines,
        [
            "[+]data_corruption ok",
            "[+]linearizable_read ok",
            "[+]serializable_read ok"
        ]
    );
    // excluded checks are not run; an unknown one is only warned about
    let excluded = http::get(
        &endpoint,
        "/readyz?verbose&exclude=linearizable_read&exclude=data_corruption&exclude=nope",
    )
    .unwrap();
    assert_eq!(excluded.status, 200);
    assert_eq!(excluded.body, "[+]serializable_read ok\nok\n");
    assert!(
        oxcd.wait_for_log(
            "some health checks cannot be excluded",
            std::time::Duration::from_secs(10)
        )
        .is_some(),
        "the unknown exclusion is warned about"
    );
    // a sub-path runs its one check; exclusion applies to the root only
    let one = http::get(
        &endpoint,
        "/readyz/serializable_read?verbose&exclude=serializable_read",
    )
    .unwrap();
    assert_eq!(one.body, "[+]serializable_read ok\nok\n");

    let post = http::post(&endpoint, "/readyz", "").unwrap();
    assert_eq!(post.status, 405);
    assert_eq!(post.body, "Method Not Allowed\n");
    assert_eq!(post.header("allow"), Some("GET"));

    let metrics = http::get(&endpoint, "/metrics").unwrap().body;
    for series in [
        "etcd_server_healthcheck{name=\"serializable_read\",type=\"livez\"} 1",
        "etcd_server_healthcheck{name=\"linearizable_read\",type=\"readyz\"} 1",
        "etcd_server_healthchecks_total{name=\"data_corruption\",status=\"success\",type=\"readyz\"}",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
}
