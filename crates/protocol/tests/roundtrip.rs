//! Round trips for every message, delta exactness and quantisation bounds.

use proptest::prelude::*;
use starling_protocol::interest::CellGrid;
use starling_protocol::*;

fn vec3() -> impl Strategy<Value = [f32; 3]> {
    [-1e4f32..1e4, -1e4f32..1e4, -1e4f32..1e4]
}

fn text() -> impl Strategy<Value = String> {
    "[a-z_ ]{0,24}"
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Viewer), Just(Role::Pilot), Just(Role::Operator)]
}

fn param_value() -> impl Strategy<Value = ParamValue> {
    prop_oneof![
        any::<f64>().prop_map(ParamValue::Number),
        text().prop_map(ParamValue::Text)
    ]
}

fn param_info() -> impl Strategy<Value = ParamInfo> {
    (
        text(),
        param_value(),
        any::<Option<f64>>(),
        any::<Option<f64>>(),
        proptest::collection::vec(text(), 0..4),
        any::<bool>(),
    )
        .prop_map(|(name, value, min, max, choices, live)| ParamInfo {
            name,
            value,
            min,
            max,
            choices,
            live,
        })
}

fn quant_box() -> impl Strategy<Value = QuantBox> {
    (vec3(), [0.5f32..1e4, 0.5f32..1e4, 0.5f32..1e4])
        .prop_map(|(origin_m, extent_m)| QuantBox { origin_m, extent_m })
}

fn command_kind() -> impl Strategy<Value = CommandKind> {
    prop_oneof![
        Just(CommandKind::Predator),
        Just(CommandKind::Goal),
        Just(CommandKind::Obstacle),
        Just(CommandKind::Boids),
        Just(CommandKind::Params),
        Just(CommandKind::Control),
    ]
}

fn predator_mode() -> impl Strategy<Value = PredatorMode> {
    prop_oneof![
        Just(PredatorMode::Static),
        Just(PredatorMode::Pointer),
        Just(PredatorMode::Hunter)
    ]
}

fn shape() -> impl Strategy<Value = Shape> {
    prop_oneof![
        (vec3(), 0.1f32..100.0).prop_map(|(center, radius_m)| Shape::Sphere { center, radius_m }),
        (vec3(), vec3()).prop_map(|(min, max)| Shape::Box { min, max }),
    ]
}

fn command() -> impl Strategy<Value = Command> {
    prop_oneof![
        (predator_mode(), vec3(), any::<Option<f32>>()).prop_map(|(mode, position, ttl_s)| {
            Command::AddPredator {
                mode,
                position,
                ttl_s,
            }
        }),
        (
            vec3(),
            proptest::collection::vec(vec3(), 0..5),
            any::<bool>(),
            any::<Option<f32>>()
        )
            .prop_map(|(position, waypoints, looping, ttl_s)| Command::AddGoal {
                position,
                waypoints,
                looping,
                ttl_s
            }),
        (shape(), any::<Option<f32>>())
            .prop_map(|(shape, ttl_s)| Command::AddObstacle { shape, ttl_s }),
        (any::<u32>(), vec3()).prop_map(|(id, position)| Command::MoveAgent { id, position }),
        any::<u32>().prop_map(|id| Command::RemoveAgent { id }),
        (vec3(), any::<u32>(), any::<f32>()).prop_map(|(center, count, spread_m)| {
            Command::SpawnBoids {
                center,
                count,
                spread_m,
            }
        }),
        proptest::collection::vec((text(), param_value()), 0..6)
            .prop_map(|changes| Command::PatchParams { changes }),
        text().prop_map(|name| Command::Preset { name }),
        Just(Command::Pause),
        Just(Command::Resume),
        any::<u32>().prop_map(|n| Command::Step { n }),
        any::<Option<u64>>().prop_map(|seed| Command::Reset { seed }),
        any::<u32>().prop_map(|count| Command::KillBoids { count }),
        any::<u32>().prop_map(|count| Command::FreezeBoids { count }),
        Just(Command::ThawBoids),
        any::<u64>().prop_map(|tick| Command::Seek { tick }),
        any::<u32>().prop_map(|count| Command::SetPopulation { count }),
    ]
}

fn client_msg() -> impl Strategy<Value = ClientMsg> {
    prop_oneof![
        (
            any::<u16>(),
            any::<u16>(),
            any::<u16>(),
            proptest::option::of(view())
        )
            .prop_map(|(major, minor, max_fps, region)| ClientMsg::Subscribe {
                major,
                minor,
                max_fps,
                region
            }),
        any::<u16>().prop_map(|max_fps| ClientMsg::SetRate { max_fps }),
        (any::<u32>(), command()).prop_map(|(request_id, command)| ClientMsg::Command {
            request_id,
            command
        }),
        Just(ClientMsg::Resync),
        any::<u64>().prop_map(|nonce| ClientMsg::Ping { nonce }),
        view().prop_map(ClientMsg::SetView),
    ]
}

fn view() -> impl Strategy<Value = View> {
    (
        vec3(),
        vec3(),
        proptest::option::of(vec3()),
        any::<Option<u32>>(),
    )
        .prop_map(|(min, max, eye, budget_bytes_per_s)| View {
            min,
            max,
            eye,
            budget_bytes_per_s,
        })
}

fn server_msg() -> impl Strategy<Value = ServerMsg> {
    let hello = (
        any::<u16>(),
        any::<u16>(),
        text(),
        vec3(),
        quant_box(),
        proptest::collection::vec(param_info(), 0..5),
        role(),
        proptest::collection::vec(command_kind(), 0..6),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(
            |(major, minor, server, world_m, quant, params, role, allowed, max_fps, tick_hz)| {
                ServerMsg::Hello(Hello {
                    major,
                    minor,
                    server,
                    world: WorldInfo {
                        world_m,
                        dims: 3,
                        quant,
                        tick_hz,
                    },
                    params,
                    role,
                    allowed,
                    max_fps,
                })
            },
        );
    let agents = (
        any::<u64>(),
        proptest::collection::vec(
            (any::<u32>(), predator_mode(), vec3(), vec3()).prop_map(
                |(id, mode, position, velocity)| PredatorInfo {
                    id,
                    mode,
                    position,
                    velocity,
                },
            ),
            0..4,
        ),
        proptest::collection::vec(
            (
                any::<u32>(),
                vec3(),
                proptest::collection::vec(vec3(), 0..4),
                any::<bool>(),
                any::<f32>(),
            )
                .prop_map(|(id, target, waypoints, looping, arrive_radius_m)| {
                    GoalInfo {
                        id,
                        target,
                        waypoints,
                        looping,
                        arrive_radius_m,
                    }
                }),
            0..4,
        ),
        proptest::collection::vec(
            (any::<u32>(), shape()).prop_map(|(id, shape)| ObstacleInfo { id, shape }),
            0..4,
        ),
    )
        .prop_map(|(tick, predators, goals, obstacles)| {
            ServerMsg::Agents(AgentList {
                tick,
                predators,
                goals,
                obstacles,
            })
        });
    let swarm = (
        any::<u32>(),
        any::<f32>(),
        any::<u32>(),
        any::<u32>(),
        any::<Option<f32>>(),
        any::<Option<f32>>(),
        any::<Option<f32>>(),
    );
    let base = (
        any::<u64>(),
        any::<u32>(),
        any::<f32>(),
        any::<f32>(),
        any::<Option<f32>>(),
        any::<Option<f32>>(),
        any::<f32>(),
        any::<bool>(),
    );
    let metrics = (base, swarm).prop_map(|(b, s)| {
        ServerMsg::Metrics(Metrics {
            tick: b.0,
            population: b.1,
            order: b.2,
            mean_speed_mps: b.3,
            min_nn_m: b.4,
            mean_nn_m: b.5,
            tick_ms: b.6,
            paused: b.7,
            collisions: s.0,
            collision_ratio: s.1,
            clusters: s.2,
            largest_cluster: s.3,
            obstacle_clearance_m: s.4,
            goal_distance_m: s.5,
            velocity_correlation: s.6,
        })
    });
    let code = prop_oneof![
        Just(ErrorCode::BadRequest),
        Just(ErrorCode::Forbidden),
        Just(ErrorCode::NotFound),
        Just(ErrorCode::LimitReached),
        Just(ErrorCode::RateLimited),
        Just(ErrorCode::VersionMismatch),
        Just(ErrorCode::Unsupported),
        Just(ErrorCode::Busy),
    ];
    let reason = prop_oneof![
        Just(CloseReason::Shutdown),
        Just(CloseReason::VersionMismatch),
        Just(CloseReason::ProtocolError),
        Just(CloseReason::TooSlow),
        Just(CloseReason::Unauthorized),
        Just(CloseReason::Busy),
    ];
    prop_oneof![
        hello,
        proptest::collection::vec(param_info(), 0..5).prop_map(ServerMsg::Params),
        agents,
        metrics,
        (any::<u32>(), any::<u64>(), any::<Option<u32>>()).prop_map(|(request_id, tick, id)| {
            ServerMsg::Ack(Ack {
                request_id,
                tick,
                id,
            })
        }),
        (
            any::<Option<u32>>(),
            code,
            proptest::option::of(text()),
            text()
        )
            .prop_map(
                |(request_id, code, field, detail)| ServerMsg::Error(ErrorMsg {
                    request_id,
                    code,
                    field,
                    detail
                })
            ),
        (any::<u64>(), any::<u64>()).prop_map(|(nonce, tick)| ServerMsg::Pong { nonce, tick }),
        (reason, text()).prop_map(|(reason, detail)| ServerMsg::Close(Close { reason, detail })),
        (
            [1u16..=16, 1u16..=16, 1u16..=16],
            quant_box(),
            any::<u32>(),
            any::<f32>()
        )
            .prop_map(
                |(cells, quant, budget_bytes_per_s, summary_hz)| ServerMsg::Interest(
                    InterestInfo {
                        grid: CellGrid { cells },
                        quant,
                        budget_bytes_per_s,
                        summary_hz,
                    }
                )
            ),
    ]
}

/// Bit-level equality (NaN payloads included) via the encoding itself.
fn same_server(a: &ServerMsg, b: &ServerMsg) -> bool {
    let (mut x, mut y) = (Vec::new(), Vec::new());
    encode_server(a, &mut x).unwrap();
    encode_server(b, &mut y).unwrap();
    x == y
}

/// A random walk of `n` boids over `frames` frames: mostly smooth motion
/// (what prediction is for) with occasional jumps (exceptions).
fn walk() -> impl Strategy<Value = Vec<Frame>> {
    (1usize..60, 2usize..6, any::<u64>(), quant_box()).prop_map(|(n, frames, seed, quant)| {
        let mut s = seed | 1;
        let mut rnd = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        let ids: Vec<u32> = {
            let mut next = rnd() as u32 % 1000;
            (0..n)
                .map(|_| {
                    next += 1 + (rnd() % 3) as u32;
                    next
                })
                .collect()
        };
        let mut pos: Vec<i32> = (0..3 * n).map(|_| (rnd() % 65536) as i32).collect();
        let mut vel: Vec<i32> = (0..3 * n).map(|_| (rnd() % 401) as i32 - 200).collect();
        let mut heading: Vec<u8> = (0..2 * n).map(|_| rnd() as u8).collect();
        let mut out = Vec::new();
        for f in 0..frames {
            for k in 0..3 * n {
                if rnd() % 50 == 0 {
                    pos[k] = (rnd() % 65536) as i32; // a jump
                }
                vel[k] += (rnd() % 21) as i32 - 10;
                pos[k] = (pos[k] + vel[k]).clamp(0, 65535);
            }
            for h in &mut heading {
                *h = h.wrapping_add((rnd() % 7) as u8).wrapping_sub(3);
            }
            out.push(Frame {
                tick: 100 + 2 * f as u64,
                quant: Some(quant),
                ids: ids.clone(),
                pos: pos.iter().map(|&p| p as u16).collect(),
                heading: heading.clone(),
            });
        }
        out
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn every_client_message_round_trips(msg in client_msg()) {
        let mut bytes = Vec::new();
        encode_client(&msg, &mut bytes).unwrap();
        let back = decode_client(&bytes).unwrap();
        let mut again = Vec::new();
        encode_client(&back, &mut again).unwrap();
        prop_assert_eq!(bytes, again);
    }

    #[test]
    fn every_server_message_round_trips(msg in server_msg()) {
        let mut bytes = Vec::new();
        encode_server(&msg, &mut bytes).unwrap();
        match decode_server(&bytes).unwrap() {
            ServerFrame::Control(back) => prop_assert!(same_server(&msg, &back)),
            other => prop_assert!(false, "decoded as {:?}", other),
        }
    }

    #[test]
    fn keyframes_round_trip(frames in walk()) {
        let mut bytes = Vec::new();
        for f in &frames {
            encode_keyframe(f, &mut bytes).unwrap();
            let ServerFrame::Keyframe(view) = decode_server(&bytes).unwrap() else { panic!("not a keyframe") };
            let mut back = Frame::default();
            view.to_frame(&mut back);
            prop_assert_eq!(&back, f);
        }
    }

    /// delta(prev → next) applied to prev equals next exactly, with and
    /// without the second base frame.
    #[test]
    fn deltas_rebuild_the_next_frame_exactly(frames in walk()) {
        let mut bytes = Vec::new();
        let mut out = Frame::default();
        for w in frames.windows(2) {
            encode_delta(None, &w[0], &w[1], &mut bytes).unwrap();
            let ServerFrame::Delta(d) = decode_server(&bytes).unwrap() else { panic!("not a delta") };
            d.apply(None, &w[0], &mut out).unwrap();
            prop_assert_eq!(&out, &w[1]);
        }
        for w in frames.windows(3) {
            encode_delta(Some(&w[0]), &w[1], &w[2], &mut bytes).unwrap();
            let ServerFrame::Delta(d) = decode_server(&bytes).unwrap() else { panic!("not a delta") };
            d.apply(Some(&w[0]), &w[1], &mut out).unwrap();
            prop_assert_eq!(&out, &w[2]);
            // The wrong base is refused, not misapplied.
            prop_assert!(d.apply(None, &w[1], &mut out).is_err());
            prop_assert!(d.apply(Some(&w[0]), &w[0], &mut out).is_err());
        }
    }

    #[test]
    fn quantised_positions_are_within_half_a_step(t in [0.0f32..=1.0, 0.0f32..=1.0, 0.0f32..=1.0], q in quant_box()) {
        let p: [f32; 3] = std::array::from_fn(|a| q.origin_m[a] + t[a] * q.extent_m[a]);
        let back = q.dequantize(q.quantize(p));
        let step = q.step_m();
        for a in 0..3 {
            let ulps = 4.0 * f32::EPSILON * (p[a].abs() + q.origin_m[a].abs() + q.extent_m[a]);
            prop_assert!((back[a] - p[a]).abs() <= step[a] * 0.5 + ulps, "axis {}: {} vs {}", a, back[a], p[a]);
        }
    }
}

#[test]
fn deltas_refuse_frames_with_other_boids() {
    let f = |ids: Vec<u32>, tick| Frame {
        tick,
        quant: Some(QuantBox::around_world([10.0; 3], 3)),
        pos: vec![1; 3 * ids.len()],
        heading: vec![1; 2 * ids.len()],
        ids,
    };
    let mut out = Vec::new();
    assert_eq!(
        encode_delta(None, &f(vec![1, 2], 1), &f(vec![1, 3], 2), &mut out),
        Err(EncodeError::NotDeltaCompatible("boids"))
    );
    assert_eq!(
        encode_keyframe(&f(vec![2, 1], 1), &mut out),
        Err(EncodeError::IdsNotAscending { index: 1, id: 1 })
    );
}

#[test]
fn frame_builder_orders_by_id_dense_and_sparse() {
    let quant = QuantBox::around_world([100.0; 3], 3);
    for ids in [vec![5u32, 3, 4, 0], vec![4_000_000_000, 7, 1_000_000]] {
        let mut b = FrameBuilder::default();
        let mut f = Frame::default();
        b.build(&mut f, 9, quant, ids.len(), |i| {
            (ids[i], [i as f32; 3], [1.0, 0.0, 0.0])
        })
        .unwrap();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        assert_eq!(f.ids, sorted);
        // Each position follows its id.
        for (k, id) in f.ids.iter().enumerate() {
            let src = ids.iter().position(|x| x == id).unwrap();
            assert_eq!(f.position(k), quant.quantize([src as f32; 3]));
        }
    }
    let mut f = Frame::default();
    let dup = FrameBuilder::default().build(&mut f, 0, quant, 2, |_| (1, [0.0; 3], [0.0; 3]));
    assert!(matches!(dup, Err(EncodeError::Shape(_))));
}

/// One builder reused across frames, as the server's is (its id buffer
/// trades places with the frame's), builds each as a fresh one does, with
/// dense ids or sparse; a refused build (a duplicate id) leaves the frame
/// as it was.
#[test]
fn a_reused_builder_builds_what_a_fresh_one_does_and_a_refusal_leaves_the_frame() {
    let quant = QuantBox::around_world([100.0; 3], 3);
    let mut builder = FrameBuilder::default();
    let mut frames = [Frame::default(), Frame::default(), Frame::default()];
    let sets: [Vec<u32>; 5] = [
        (0..50).rev().collect(),
        (0..50).map(|i| i * 100_000).collect(),
        (5..80).collect(),
        vec![3, 9, 3],
        vec![7_000_000, 2, 7_000_000],
    ];
    for (k, ids) in sets.iter().enumerate() {
        let boid = |i: usize| (ids[i], [i as f32, 2.0, 3.0], [1.0, -1.0, 0.5]);
        let mut fresh = Frame::default();
        let want = FrameBuilder::default().build(&mut fresh, k as u64, quant, ids.len(), boid);
        let out = &mut frames[k % 3];
        let before = out.clone();
        let got = builder.build_with(
            out,
            k as u64,
            quant,
            ids.len(),
            |i| ids[i],
            |order, pos, heading| {
                let slots = pos.chunks_exact_mut(3).zip(heading.chunks_exact_mut(2));
                for (&i, (p, h)) in order.iter().zip(slots) {
                    let (_, pi, vi) = boid(i as usize);
                    p.copy_from_slice(&quant.quantize(pi));
                    h.copy_from_slice(&oct_encode(vi));
                }
            },
        );
        assert_eq!(got.is_ok(), want.is_ok(), "set {k}");
        if want.is_ok() {
            assert_eq!(*out, fresh, "set {k}");
        } else {
            assert_eq!(*out, before, "set {k}");
        }
    }
}

proptest! {
    /// The server quantises in chunks of frame slots on several threads
    /// (`build_with`): in any chunking, taken in any order, the frame is
    /// `build`'s to the byte, and a duplicate id is refused the same way.
    #[test]
    fn a_chunked_build_is_the_serial_build(
        boids in proptest::collection::vec((0u32..400, vec3(), vec3()), 1..300),
        chunk in 1usize..70,
    ) {
        let quant = QuantBox::around_world([2e4; 3], 3);
        let n = boids.len();
        let boid = |i: usize| boids[i];
        let (mut serial, mut chunked) = (Frame::default(), Frame::default());
        let want = FrameBuilder::default().build(&mut serial, 7, quant, n, boid);
        let got = FrameBuilder::default().build_with(&mut chunked, 7, quant, n, |i| boids[i].0, |order, pos, heading| {
            let parts: Vec<_> = order
                .chunks(chunk)
                .zip(pos.chunks_mut(3 * chunk))
                .zip(heading.chunks_mut(2 * chunk))
                .collect();
            for ((order, pos), heading) in parts.into_iter().rev() {
                let slots = pos.chunks_exact_mut(3).zip(heading.chunks_exact_mut(2));
                for (&i, (p, h)) in order.iter().zip(slots) {
                    p.copy_from_slice(&quant.quantize(boids[i as usize].1));
                    h.copy_from_slice(&oct_encode(boids[i as usize].2));
                }
            }
        });
        prop_assert_eq!(&got, &want);
        if want.is_ok() {
            prop_assert_eq!(chunked, serial);
        }
    }
}
