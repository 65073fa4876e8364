//! `lease-keepalive`: etcd's `benchmark lease-keepalive`. Each client grants
//! one lease (TTL 100 s), then each request is clientv3's `KeepAliveOnce`: a
//! fresh LeaseKeepAlive stream carrying one request and one response.

use api::etcdserverpb::lease_client::LeaseClient;
use api::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest};

use crate::auth::Connection;
use crate::client::{drive, status_message, Settings};

const LEASE_TTL_SECS: i64 = 100;

pub async fn run(settings: &Settings, total: u64) -> Result<(), String> {
    let mut clients: Vec<(LeaseClient<Connection>, Result<i64, String>)> = Vec::new();
    for connection in settings.clients().await? {
        let mut lease = LeaseClient::new(connection);
        let grant = lease
            .lease_grant(LeaseGrantRequest {
                ttl: LEASE_TTL_SECS,
                id: 0,
            })
            .await
            .map(|r| r.into_inner().id)
            .map_err(|s| status_message(&s));
        clients.push((lease, grant));
    }
    let progress = settings.progress(total);
    let stats = drive(clients, total, None, &progress, |client, _| {
        let (lease, grant) = client;
        let mut lease = lease.clone();
        let grant = grant.clone();
        async move {
            // A client whose grant failed fails every request it takes.
            let id = grant?;
            let request = LeaseKeepAliveRequest { id };
            let response = lease
                .lease_keep_alive(tokio_stream::once(request))
                .await
                .map_err(|s| status_message(&s))?;
            match response.into_inner().message().await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("lease keepalive stream closed without a response".into()),
                Err(s) => Err(status_message(&s)),
            }
        }
    })
    .await;
    progress.finish().await;
    let out = settings.output();
    out.report("", &stats, "");
    out.json(&stats, &[]);
    Ok(())
}
