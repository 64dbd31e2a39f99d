//! The command line: one role and the addresses it needs.

use std::net::SocketAddr;
use std::time::Duration;

pub(crate) const USAGE: &str = "usage: pipeline <api|worker|relay|model|mailer|all> \
--redis URL --postgres URL [--addr ADDR] [--model URL] [--mailer URL] [--claim-idle-ms N] \
[--max-deliveries N] [--model-timeout-ms N] [--job-deadline-ms N] [--poll-ms N] [--linger-ms N]";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Api,
    Worker,
    Relay,
    Model,
    Mailer,
    All,
}

#[derive(Clone, Debug)]
pub(crate) struct Args {
    pub(crate) role: Role,
    pub(crate) redis: String,
    pub(crate) postgres: String,
    pub(crate) addr: SocketAddr,
    pub(crate) model: String,
    pub(crate) mailer: String,
    pub(crate) claim_idle: Duration,
    pub(crate) max_deliveries: u64,
    pub(crate) model_timeout: Duration,
    pub(crate) job_deadline: Duration,
    pub(crate) poll: Duration,
    pub(crate) linger: Duration,
}

impl Args {
    pub(crate) fn parse(mut argv: impl Iterator<Item = String>) -> Result<Self, String> {
        let role = match argv.next().as_deref() {
            Some("api") => Role::Api,
            Some("worker") => Role::Worker,
            Some("relay") => Role::Relay,
            Some("model") => Role::Model,
            Some("mailer") => Role::Mailer,
            Some("all") => Role::All,
            Some(other) => return Err(format!("unknown role {other:?}")),
            None => return Err("a role is required".into()),
        };
        let default_addr = match role {
            Role::Model => "127.0.0.1:3001",
            Role::Mailer => "127.0.0.1:3002",
            _ => "127.0.0.1:3000",
        };
        let mut args = Self {
            role,
            redis: String::new(),
            postgres: String::new(),
            addr: default_addr.parse().map_err(|_| "bad default address")?,
            model: "http://127.0.0.1:3001".into(),
            mailer: "http://127.0.0.1:3002".into(),
            claim_idle: Duration::from_secs(30),
            max_deliveries: 5,
            model_timeout: Duration::from_secs(5),
            job_deadline: Duration::from_secs(12),
            poll: Duration::from_secs(1),
            linger: Duration::ZERO,
        };
        while let Some(flag) = argv.next() {
            let value = argv.next().ok_or(format!("{flag} needs a value"))?;
            let ms = |v: &str| {
                v.parse::<u64>()
                    .map(Duration::from_millis)
                    .map_err(|_| format!("{flag}: not a number of milliseconds: {v}"))
            };
            match flag.as_str() {
                "--redis" => args.redis = value,
                "--postgres" => args.postgres = value,
                "--addr" => {
                    args.addr = value
                        .parse()
                        .map_err(|_| format!("--addr: not an address: {value}"))?
                }
                "--model" => args.model = value.trim_end_matches('/').to_owned(),
                "--mailer" => args.mailer = value.trim_end_matches('/').to_owned(),
                "--claim-idle-ms" => args.claim_idle = ms(&value)?,
                "--max-deliveries" => {
                    args.max_deliveries = value
                        .parse()
                        .map_err(|_| format!("--max-deliveries: not a number: {value}"))?
                }
                "--model-timeout-ms" => args.model_timeout = ms(&value)?,
                "--job-deadline-ms" => args.job_deadline = ms(&value)?,
                "--poll-ms" => args.poll = ms(&value)?,
                "--linger-ms" => args.linger = ms(&value)?,
                _ => return Err(format!("unknown option {flag}")),
            }
        }
        let needs_redis = matches!(role, Role::Api | Role::Worker | Role::All);
        let needs_postgres = matches!(role, Role::Api | Role::Worker | Role::Relay | Role::All);
        if needs_redis && args.redis.is_empty() {
            return Err("--redis URL is required for this role".into());
        }
        if needs_postgres && args.postgres.is_empty() {
            return Err("--postgres URL is required for this role".into());
        }
        Ok(args)
    }
}

/// `addr` with its port moved up by `by`.
pub(crate) fn next_port(addr: SocketAddr, by: u16) -> Result<SocketAddr, String> {
    let port = addr
        .port()
        .checked_add(by)
        .ok_or("--addr: no room for the next ports")?;
    Ok(SocketAddr::new(addr.ip(), port))
}
