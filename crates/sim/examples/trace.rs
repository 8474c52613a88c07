//! Prints a flock's metrics as it forms: `cargo run --release -p starling-sim
//! --example trace -- [population] [ticks] [every]`.

use starling_sim::{Flock, FlockConfig};

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let population = args.first().copied().unwrap_or(5_000);
    let ticks = args.get(1).copied().unwrap_or(1_200);
    let every = args.get(2).copied().unwrap_or(60).max(1);
    let mut config = FlockConfig {
        population,
        ..FlockConfig::default()
    };
    for kv in std::env::args().skip(1).filter(|a| a.contains('=')) {
        let (k, v) = kv.split_once('=').unwrap();
        let f: f32 = v.parse().unwrap();
        let p = &mut config.params;
        match k {
            "w_sep" => p.w_sep = f,
            "w_ali" => p.w_ali = f,
            "w_coh" => p.w_coh = f,
            "w_wander" => p.w_wander = f,
            "sep" => p.sep_radius_m = f,
            "ali" => p.ali_radius_m = f,
            "coh" => p.coh_radius_m = f,
            "fov" => p.fov_deg = f,
            "k" => p.k_nearest = f as u32,
            "force" => p.max_force_mps2 = f,
            "min" => p.min_speed_mps = f,
            "max" => p.max_speed_mps = f,
            "scale" => p.world_m = p.world_m.map(|w| w * f),
            _ => panic!("unknown {k}"),
        }
    }
    let mut flock = Flock::new(config).expect("valid config");
    println!("tick,order,mean_speed_mps,min_nn_m,mean_nn_m,isolated,mean_candidates,step_ms");
    for t in 1..=ticks {
        flock.step();
        if t % every == 0 {
            let m = flock.metrics();
            println!(
                "{},{:.3},{:.2},{:.2},{:.2},{},{:.1},{:.2}",
                m.tick,
                m.order,
                m.mean_speed_mps,
                m.min_nn_m.unwrap_or(f32::NAN),
                m.mean_nn_m.unwrap_or(f32::NAN),
                m.isolated,
                m.mean_candidates,
                m.step_ms
            );
        }
    }
}
