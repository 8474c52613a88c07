//! Who may do what, over REST and the WebSocket alike: one data table of
//! every mutating route and command × every role (× whose agent, for moves
//! and removals), and one rate and one agent cap per token whichever
//! transport a pilot uses.

use super::common::*;
use reqwest::Method;
use serde_json::{Value, json};
use starling_protocol::{Command, ErrorCode, ParamValue, PredatorMode, Shape};
use starling_server::config::Config;

/// The callers: no token, and one token per role (two pilots).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Who {
    Anonymous,
    Viewer,
    PilotA,
    PilotB,
    Operator,
}

const EVERYONE: [Who; 5] = [
    Who::Anonymous,
    Who::Viewer,
    Who::PilotA,
    Who::PilotB,
    Who::Operator,
];

impl Who {
    fn token(self) -> Option<&'static str> {
        match self {
            Who::Anonymous => None,
            Who::Viewer => Some("viewer-token"),
            Who::PilotA => Some("pilot-a-token"),
            Who::PilotB => Some("pilot-b-token"),
            Who::Operator => Some("operator-token"),
        }
    }

    fn is_pilot(self) -> bool {
        matches!(self, Who::PilotA | Who::PilotB)
    }
}

fn config() -> Config {
    Config {
        population: 200,
        viewer_token: vec!["viewer-token".into()],
        pilot_token: vec!["pilot-a-token".into(), "pilot-b-token".into()],
        operator_token: vec!["operator-token".into()],
        pilot_rate_per_s: 1000.0,
        pilot_agents_each: 256,
        pilot_agents_total: 1024,
        ..test_config()
    }
}

/// The least caller a row needs.
#[derive(Debug, Clone, Copy)]
enum Needs {
    Pilot,
    Operator,
}

impl Needs {
    fn lets(self, who: Who) -> bool {
        match self {
            Needs::Pilot => who.is_pilot() || who == Who::Operator,
            Needs::Operator => who == Who::Operator,
        }
    }
}

/// One mutating route and its WebSocket twin (if it has one), with the
/// REST status an allowed caller gets. Seek answers 409 to anyone allowed:
/// this server is not replaying, which it can only say once the role passed.
struct Row {
    needs: Needs,
    rest: (Method, &'static str, Option<Value>),
    ok: u16,
    ws: Option<Command>,
}

fn rows() -> Vec<Row> {
    let op = Needs::Operator;
    let row = |needs, method, path, body: Option<Value>, ok, ws| Row {
        needs,
        rest: (method, path, body),
        ok,
        ws,
    };
    vec![
        row(
            Needs::Pilot,
            Method::POST,
            "/api/v1/predators",
            Some(json!({ "position": [20, 20, 20] })),
            201,
            Some(Command::AddPredator {
                mode: PredatorMode::Static,
                position: [20.0, 20.0, 20.0],
                ttl_s: None,
            }),
        ),
        row(
            Needs::Pilot,
            Method::POST,
            "/api/v1/goals",
            Some(json!({ "position": [30, 30, 30] })),
            201,
            Some(Command::AddGoal {
                position: [30.0, 30.0, 30.0],
                waypoints: Vec::new(),
                looping: false,
                ttl_s: None,
            }),
        ),
        row(
            Needs::Pilot,
            Method::POST,
            "/api/v1/obstacles",
            Some(json!({ "sphere": { "center": [40, 40, 40], "radius_m": 2 } })),
            201,
            Some(Command::AddObstacle {
                shape: Shape::Sphere {
                    center: [40.0, 40.0, 40.0],
                    radius_m: 2.0,
                },
                ttl_s: None,
            }),
        ),
        row(
            op,
            Method::PATCH,
            "/api/v1/params",
            Some(json!({ "w_sep": 1.5 })),
            200,
            Some(Command::PatchParams {
                changes: vec![("w_sep".into(), ParamValue::Number(1.5))],
            }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/params/presets/balanced",
            None,
            200,
            Some(Command::Preset {
                name: "balanced".into(),
            }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/boids/spawn",
            Some(json!({ "center": [50, 50, 40], "count": 2 })),
            201,
            Some(Command::SpawnBoids {
                center: [50.0, 50.0, 40.0],
                count: 2,
                spread_m: 3.0,
            }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/boids/remove",
            Some(json!({ "ids": [] })),
            200,
            None,
        ),
        row(
            op,
            Method::PUT,
            "/api/v1/boids/population",
            Some(json!({ "population": 200 })),
            200,
            Some(Command::SetPopulation { count: 200 }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/boids/kill",
            Some(json!({ "count": 1 })),
            200,
            Some(Command::KillBoids { count: 1 }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/boids/freeze",
            Some(json!({ "count": 1 })),
            200,
            Some(Command::FreezeBoids { count: 1 }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/boids/thaw",
            None,
            200,
            Some(Command::ThawBoids),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/control/pause",
            None,
            200,
            Some(Command::Pause),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/control/step",
            Some(json!({ "n": 1 })),
            200,
            Some(Command::Step { n: 1 }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/control/resume",
            None,
            200,
            Some(Command::Resume),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/control/seek",
            Some(json!({ "tick": 1 })),
            409,
            Some(Command::Seek { tick: 1 }),
        ),
        row(
            op,
            Method::POST,
            "/api/v1/control/reset",
            None,
            200,
            Some(Command::Reset { seed: None }),
        ),
    ]
}

/// Creates an agent of `kind` as `owner`; returns its id.
async fn agent(server: &TestServer, owner: Who, kind: &str) -> u32 {
    let body = match kind {
        "predators" => json!({ "position": [10, 10, 10], "mode": "static" }),
        "goals" => json!({ "position": [12, 12, 12] }),
        _ => json!({ "box": { "min": [5, 5, 5], "max": [6, 6, 6] } }),
    };
    let (s, b) = rest(
        Method::POST,
        &server.url(&format!("/api/v1/{kind}")),
        owner.token(),
        Some(body),
    )
    .await;
    assert_eq!(s, 201, "{owner:?} creating a {kind}: {b}");
    b["id"].as_u64().unwrap() as u32
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_route_and_command_follows_the_role_table() {
    let server = TestServer::start(config()).await;
    let mut viewers = Vec::new();
    for who in EVERYONE {
        viewers.push(Viewer::connect(server.addr, who.token(), 1).await);
    }
    let mut request_id = 0;
    for row in rows() {
        let (method, path, body) = &row.rest;
        for (k, who) in EVERYONE.into_iter().enumerate() {
            let allowed = row.needs.lets(who);
            let (s, b) = rest(method.clone(), &server.url(path), who.token(), body.clone()).await;
            let want = if allowed { row.ok } else { 403 };
            assert_eq!(s, want, "REST {method} {path} as {who:?}: {b}");
            if !allowed {
                assert_eq!(b["error"], "forbidden", "{b}");
            }
            let Some(command) = row.ws.clone() else {
                continue;
            };
            request_id += 1;
            match (
                viewers[k].command(request_id, command.clone()).await,
                allowed,
            ) {
                (Reply::Ack(_), true) => {}
                (Reply::Error(e), true) if row.ok == 409 => {
                    assert_ne!(e.code, ErrorCode::Forbidden, "{command:?} as {who:?}")
                }
                (Reply::Error(e), false) => {
                    assert_eq!(e.code, ErrorCode::Forbidden, "{command:?} as {who:?}")
                }
                (reply, _) => panic!("{command:?} as {who:?}: {reply:?}"),
            }
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pilots_move_and_remove_only_their_own_agents_operators_any() {
    let server = TestServer::start(config()).await;
    let mut viewers = Vec::new();
    for who in EVERYONE {
        viewers.push(Viewer::connect(server.addr, who.token(), 1).await);
    }
    let mut request_id = 1000;
    for kind in ["predators", "goals", "obstacles"] {
        for owner in [Who::PilotA, Who::Operator] {
            for (k, who) in EVERYONE.into_iter().enumerate() {
                let allowed = who == Who::Operator || who == owner;
                let why = format!("{who:?} on {owner:?}'s {kind}");
                // REST: move, then remove.
                let id = agent(&server, owner, kind).await;
                let url = server.url(&format!("/api/v1/{kind}/{id}"));
                let moved = Some(json!({ "position": [15, 15, 15] }));
                for (method, body) in [(Method::PATCH, moved), (Method::DELETE, None)] {
                    let (s, b) = rest(method.clone(), &url, who.token(), body).await;
                    if allowed {
                        assert_eq!(s, 200, "REST {method} {why}: {b}");
                    } else {
                        assert_eq!(s, 403, "REST {method} {why}: {b}");
                        if who.is_pilot() {
                            // Refused for whose it is: the body names the agent.
                            assert_eq!(b["field"], "id", "{why}: {b}");
                            assert!(b["detail"].as_str().unwrap().contains(&id.to_string()));
                        }
                    }
                }
                // WebSocket: the same, with the commands.
                let id = agent(&server, owner, kind).await;
                let commands = [
                    Command::MoveAgent {
                        id,
                        position: [15.0, 15.0, 15.0],
                    },
                    Command::RemoveAgent { id },
                ];
                for command in commands {
                    request_id += 1;
                    match (
                        viewers[k].command(request_id, command.clone()).await,
                        allowed,
                    ) {
                        (Reply::Ack(_), true) => {}
                        (Reply::Error(e), false) => {
                            assert_eq!(e.code, ErrorCode::Forbidden, "{command:?}: {why}");
                            if who.is_pilot() {
                                assert_eq!(e.field.as_deref(), Some("id"), "{why}");
                                assert!(e.detail.contains(&id.to_string()), "{}", e.detail);
                            }
                        }
                        (reply, _) => panic!("{command:?}: {why}: {reply:?}"),
                    }
                }
                // What was refused is still there, untouched.
                let listed = get(&server.url(&format!("/api/v1/{kind}"))).await;
                let still = listed.as_array().unwrap().iter().any(|a| a["id"] == id);
                assert_eq!(still, !allowed, "{why}: {listed}");
            }
        }
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pilot_token_has_one_agent_cap_across_rest_and_websocket() {
    let server = TestServer::start(Config {
        pilot_agents_each: 4,
        ..config()
    })
    .await;
    let url = server.url("/api/v1/goals");
    let goal = |x: i32| Some(json!({ "position": [x, 20, 30] }));
    let mut ws = Viewer::connect(server.addr, Who::PilotA.token(), 1).await;
    for x in 0..2 {
        let (s, b) = rest(Method::POST, &url, Who::PilotA.token(), goal(x)).await;
        assert_eq!(s, 201, "{b}");
    }
    let add = |x: f32| Command::AddGoal {
        position: [x, 20.0, 30.0],
        waypoints: Vec::new(),
        looping: false,
        ttl_s: None,
    };
    for x in 0..2 {
        assert!(matches!(ws.command(x, add(x as f32)).await, Reply::Ack(_)));
    }
    // Four held, two over each transport: the fifth is refused on both.
    match ws.command(9, add(9.0)).await {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::LimitReached, "{}", e.detail),
        Reply::Ack(a) => panic!("a fifth agent over WebSocket: {a:?}"),
    }
    let (s, b) = rest(Method::POST, &url, Who::PilotA.token(), goal(9)).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (409, Some("limit_reached")),
        "{b}"
    );
    // Another pilot token has a cap of its own.
    let (s, b) = rest(Method::POST, &url, Who::PilotB.token(), goal(10)).await;
    assert_eq!(s, 201, "{b}");
    // Removing one frees room, whichever transport created it.
    let mine = get(&url).await.as_array().unwrap()[0]["id"]
        .as_u64()
        .unwrap();
    let (s, b) = rest(
        Method::DELETE,
        &server.url(&format!("/api/v1/goals/{mine}")),
        Who::PilotA.token(),
        None,
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert!(matches!(ws.command(11, add(11.0)).await, Reply::Ack(_)));
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pilot_token_has_one_rate_across_rest_and_websocket() {
    // 0.1 commands a second, burst 1: one command, then nothing for 10 s.
    let server = TestServer::start(Config {
        pilot_rate_per_s: 0.1,
        ..config()
    })
    .await;
    let url = server.url("/api/v1/goals");
    let body = Some(json!({ "position": [10, 20, 30] }));
    let (s, b) = rest(Method::POST, &url, Who::PilotA.token(), body.clone()).await;
    assert_eq!(s, 201, "{b}");
    let mut ws = Viewer::connect(server.addr, Who::PilotA.token(), 1).await;
    let add = Command::AddGoal {
        position: [11.0, 20.0, 30.0],
        waypoints: Vec::new(),
        looping: false,
        ttl_s: None,
    };
    match ws.command(1, add.clone()).await {
        Reply::Error(e) => assert_eq!(e.code, ErrorCode::RateLimited, "{}", e.detail),
        Reply::Ack(a) => panic!("the WebSocket had a bucket of its own: {a:?}"),
    }
    let (s, b) = rest(Method::POST, &url, Who::PilotA.token(), body.clone()).await;
    assert_eq!(s, 429, "{b}");
    // The other pilot's bucket is its own.
    let mut other = Viewer::connect(server.addr, Who::PilotB.token(), 1).await;
    assert!(matches!(other.command(2, add).await, Reply::Ack(_)));
    server.stop().await.unwrap();
}

#[tokio::test]
async fn a_token_that_matches_none_is_told_so_and_watches_read_only() {
    let server = TestServer::start(config()).await;
    let mut v = Viewer::connect(server.addr, Some("not-a-token-at-all"), 30).await;
    assert_eq!(v.hello.role, starling_protocol::Role::Viewer);
    assert!(
        v.until(|s| s.errors.iter().any(|e| e.request_id.is_none()
            && e.field.as_deref() == Some("token")
            && e.detail.contains("not recognised")))
            .await,
        "the viewer is told its token is not recognised"
    );
    // A known token, or none, is not told anything of the kind.
    let mut ok = Viewer::connect(server.addr, Some("operator-token"), 30).await;
    ok.next_frame().await;
    ok.next_frame().await;
    assert!(ok.seen.errors.is_empty(), "{:?}", ok.seen.errors);
    // Over REST a refusal says so too; the scheme's name is in any case.
    let pause = |auth: &'static str| {
        reqwest::Client::new()
            .post(server.url("/api/v1/control/pause"))
            .header("authorization", auth)
            .send()
    };
    let r = pause("Bearer not-a-token-at-all").await.unwrap();
    assert_eq!(r.status(), 403);
    let b: Value = r.json().await.unwrap();
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("not one this server knows"),
        "{b}"
    );
    let r = pause("bearer operator-token").await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let r = pause("BEARER operator-token").await.unwrap();
    assert_eq!(r.status(), 200);
    server.stop().await.unwrap();
}
