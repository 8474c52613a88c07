//! The interest stream (protocol 1.2) against a running server: a viewer
//! that subscribes with a view gets the cells it looks at in full and the
//! whole flock as summaries, within its byte budget; moving the view moves
//! the cells; bad views are refused naming the field.

use std::time::Instant;

use starling_protocol::interest::CellMirror;
use starling_protocol::{
    COMPACT_BATCH_MINOR, ClientMsg, ErrorCode, NO_HEADING_MINOR, RANGE_MINOR, RICE_MINOR, View,
};
use starling_server::config::Config;

use crate::common::{TestServer, Viewer, test_config};

/// Every held cell lies in `view`, and its boids lie in their cell: at a
/// coarse precision, somewhere in the coarse step their sent coordinates
/// start (the step may begin in the cell before).
fn check_held(m: &CellMirror, view: &View) {
    let grid = m.grid();
    for c in m.held_cells() {
        let f = m.cell(c).unwrap();
        let quant = f.quant.unwrap();
        let (lo, hi) = grid.bounds_m(c, &quant);
        assert!(
            (0..3).all(|a| hi[a] >= view.min[a] && lo[a] <= view.max[a]),
            "cell {c} ({lo:?} .. {hi:?}) is held but not in view"
        );
        let low = !m.precision(c).pos_mask();
        for i in 0..f.len() {
            let q = f.position(i);
            let top = q.map(|x| x | low);
            assert!(
                grid.cell_of(q) == c || grid.cell_of(top) == c,
                "boid {} at {q:?} (precision {:?}) is in another cell than {c}",
                f.ids[i],
                m.precision(c)
            );
        }
    }
}

/// A corner of the 160 × 160 × 80 m world, seen from above, within `budget`.
fn corner(budget: u32) -> View {
    View {
        min: [0.0, 0.0, 0.0],
        max: [60.0, 60.0, 80.0],
        eye: Some([30.0, 30.0, 120.0]),
        budget_bytes_per_s: Some(budget),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_gets_its_cells_in_full_the_flock_as_summaries_and_stays_in_budget() {
    let server = TestServer::start(Config {
        population: 5_000,
        ..test_config()
    })
    .await;
    let budget = 64_000;
    let corner = corner(budget);
    let mut v = Viewer::connect_view(server.addr, None, 30, Some(corner)).await;
    let start = Instant::now();
    let (mut batches, mut updates) = (0, 0);
    let bytes_before = v.bytes;
    while start.elapsed().as_secs_f64() < 3.0 {
        updates += v.next_cells().await.updates;
        batches += 1;
    }
    let elapsed = start.elapsed().as_secs_f64();
    let bytes = (v.bytes - bytes_before) as f64;
    let info = v.interest.expect("an Interest message");
    assert_eq!(info.budget_bytes_per_s, budget);
    let m = v.mirror.as_ref().unwrap();
    // The whole flock as summaries; the corner in full.
    let summarised: u32 = m.summaries().map(|s| s.count).sum();
    assert_eq!(summarised, 5_000, "the summaries cover the flock");
    assert!(m.held_cells().count() > 0 && updates > 0, "no cell in full");
    check_held(m, &corner);
    // Within the budget (paced from an empty bucket, bursts of 0.2 s),
    // with one batch's slack.
    assert!(
        bytes <= f64::from(budget) * (elapsed + 0.2) * 1.1 + 8_000.0,
        "{bytes} bytes in {elapsed:.2} s over a budget of {budget} B/s"
    );
    assert!(batches > 10, "{batches} batches");

    // The view moves to the opposite corner: the old cells are dropped.
    let far = View {
        min: [100.0, 100.0, 0.0],
        max: [160.0, 160.0, 80.0],
        eye: None,
        budget_bytes_per_s: Some(budget),
    };
    v.send(&ClientMsg::SetView(far)).await;
    for _ in 0..60 {
        v.next_cells().await;
    }
    check_held(v.mirror.as_ref().unwrap(), &far);
    assert!(v.mirror.as_ref().unwrap().held_cells().count() > 0);
    server.stop().await.unwrap();
}

/// A 1.4 viewer gets Rice-coded cell updates where they are smaller, with
/// compact headers, a 1.5 viewer range-coded ones, and a 1.6 viewer
/// range-coded ones without headings; a 1.2 viewer of the same cells gets
/// none of these, a 1.4 viewer no range codes, no viewer before 1.6 an
/// update without headings (`Viewer` checks), and all four rebuild them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rice_and_range_codes_go_only_to_viewers_that_read_them() {
    use starling_protocol::interest::{Coding, KIND_COMPACT_CELL_UPDATE};
    let server = TestServer::start(Config {
        population: 5_000,
        ..test_config()
    })
    .await;
    let corner = corner(1_000_000);
    let mut old = Viewer::connect_minor(server.addr, None, 30, Some(corner), 2).await;
    let mut new = Viewer::connect_minor(server.addr, None, 30, Some(corner), RICE_MINOR).await;
    let mut range_v = Viewer::connect_minor(server.addr, None, 30, Some(corner), RANGE_MINOR).await;
    let mut newest =
        Viewer::connect_minor(server.addr, None, 30, Some(corner), NO_HEADING_MINOR).await;
    let mut latest =
        Viewer::connect_minor(server.addr, None, 30, Some(corner), COMPACT_BATCH_MINOR).await;
    for _ in 0..60 {
        old.next_cells().await;
        new.next_cells().await;
        range_v.next_cells().await;
        newest.next_cells().await;
        latest.next_cells().await;
    }
    let range = |v: &Viewer| v.codings.iter().filter(|c| c.1 == Coding::Range).count();
    let rice = |v: &Viewer| {
        v.codings
            .iter()
            .filter(|c| matches!(c.1, Coding::Rice(..)))
            .count()
    };
    let fixed_linear = |v: &Viewer| {
        v.codings
            .iter()
            .filter(|c| matches!(c.1, Coding::Fixed(..)) && c.1 != Coding::NONE)
            .count()
    };
    let full = |v: &Viewer| v.codings.iter().filter(|c| c.1 == Coding::NONE).count();
    let compact = |v: &Viewer| {
        v.codings
            .iter()
            .filter(|c| c.0 == KIND_COMPACT_CELL_UPDATE)
            .count()
    };
    assert_eq!(compact(&old), 0, "a 1.2 viewer got compact headers");
    assert!(compact(&new) > 0, "a 1.4 viewer got no compact header");
    assert_eq!(rice(&old), 0, "a 1.2 viewer got Rice codes");
    assert_eq!(
        range(&old) + range(&new),
        0,
        "a 1.2 or 1.4 viewer got range codes"
    );
    assert!(compact(&range_v) > 0, "a 1.5 viewer got no compact header");
    assert!(range(&range_v) > 0, "a 1.5 viewer got no range codes");
    assert!(range(&newest) > 0, "a 1.6 viewer got no range codes");
    // A 1.7 viewer gets compact batches (`Viewer` checks each batch's
    // kind against its minor) of range-coded updates.
    assert!(range(&latest) > 0, "a 1.7 viewer got no range codes");
    assert_eq!(compact(&newest), newest.codings.len() - full(&newest));
    // Every update of a 1.6 or 1.7 viewer is without headings, and its
    // held frames have none.
    for v in [&newest, &latest] {
        assert_eq!(v.headingless, v.codings.len());
        let m = v.mirror.as_ref().unwrap();
        assert!(m.held_cells().count() > 0);
        for c in m.held_cells() {
            assert!(!m.precision(c).has_heading());
            assert!(m.cell(c).unwrap().heading.iter().all(|&h| h == 0));
        }
    }
    assert!(
        fixed_linear(&old) > 0,
        "the 1.2 viewer got no delta updates"
    );
    assert!(
        rice(&new) > fixed_linear(&new),
        "a 1.4 viewer got {} Rice-coded and {} fixed-width updates",
        rice(&new),
        fixed_linear(&new)
    );
    for v in [&old, &new, &range_v, &newest] {
        check_held(v.mirror.as_ref().unwrap(), &corner);
    }
    server.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_views_are_refused_naming_the_field() {
    let server = TestServer::start(test_config()).await;
    let good = View {
        min: [0.0; 3],
        max: [50.0; 3],
        eye: None,
        budget_bytes_per_s: None,
    };
    let mut v = Viewer::connect_view(server.addr, None, 30, Some(good)).await;
    v.next_cells().await;
    for (view, field) in [
        (
            View {
                min: [f32::NAN, 0.0, 0.0],
                ..good
            },
            "view.min[0]",
        ),
        (
            View {
                max: [50.0, -1.0, 50.0],
                ..good
            },
            "view.max[1]",
        ),
        (
            View {
                eye: Some([0.0, 0.0, f32::INFINITY]),
                ..good
            },
            "view.eye[2]",
        ),
        (
            View {
                budget_bytes_per_s: Some(10),
                ..good
            },
            "view.budget_bytes_per_s",
        ),
    ] {
        v.send(&ClientMsg::SetView(view)).await;
        assert!(
            v.until(|s| s.errors.iter().any(|e| e.field.as_deref() == Some(field)))
                .await,
            "no error naming {field}"
        );
    }
    // Too many view updates are refused, and the connection goes on.
    for _ in 0..60 {
        v.send(&ClientMsg::SetView(good)).await;
    }
    assert!(
        v.until(|s| s.errors.iter().any(|e| e.code == ErrorCode::RateLimited))
            .await,
        "a flood of view updates was not limited"
    );
    v.next_cells().await;
    // A bad view at Subscribe: an error naming the field, then a Close.
    let bad = View {
        max: [50.0, 50.0, -3.0],
        ..good
    };
    let mut refused = Viewer::connect_view(server.addr, None, 30, Some(bad)).await;
    assert!(
        refused
            .until(|s| s.close.is_some()
                && s.errors
                    .iter()
                    .any(|e| e.field.as_deref() == Some("view.max[2]")))
            .await,
        "a bad view at Subscribe was not refused by name and closed: {:?}",
        refused.seen.errors
    );
    // A viewer on the whole-world stream cannot send views.
    let mut whole = Viewer::connect(server.addr, None, 30).await;
    whole.next_frame().await;
    whole.send(&ClientMsg::SetView(good)).await;
    assert!(
        whole
            .until(|s| s.errors.iter().any(|e| e.code == ErrorCode::Unsupported))
            .await
    );
    server.stop().await.unwrap();
}
