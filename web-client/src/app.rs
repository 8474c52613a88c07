//! The viewer's state and what each event does to it: messages from the
//! server, pointer and keyboard input, the render tick and the status
//! tick. `lib.rs` wires browser events to these methods.

use std::collections::VecDeque;

use glam::Vec3;
use js_sys::{ArrayBuffer, Uint8Array};
use starling_protocol::{
    AgentList, ClientMsg, CloseReason, Command, Hello, Metrics, PROTOCOL_MAJOR, PROTOCOL_MINOR,
    ParamInfo, ParamValue, PredatorMode, ServerFrame, ServerMsg, Shape, decode_server,
    encode_client, is_flock_message,
};

use crate::camera::Camera;
use crate::interest::Interest;
use crate::net::{Endpoints, NetEvent, Socket, close_words};
use crate::pace::Pace;
use crate::render::{Marker, Renderer, Scene};
use crate::stats::{History, Rate, TickLog};
use crate::stream::Stream;
use crate::ui::{Dom, PLOT_SAMPLES, Status};

/// Snapshots per second the viewer asks for.
const WANT_FPS: u16 = 30;
/// Commands awaiting an answer that the viewer remembers.
const MAX_PENDING: usize = 256;
/// Boids added per click in "add boids" mode.
const SPAWN_COUNT: u32 = 50;
/// What a preset command is called in messages (and how its reply is known).
const PRESET: &str = "preset";
/// Boids added by a click spread over the world's larger side divided by this.
const SPREAD_PER_WORLD: f32 = 40.0;
/// A clicked obstacle's radius: the world's larger side divided by this.
const OBSTACLE_PER_WORLD: f32 = 25.0;
/// Seconds a pointer predator lives if the page never removes it.
const POINTER_PREDATOR_TTL_S: f32 = 120.0;
/// Least time between predator moves sent while dragging.
const MOVE_INTERVAL_MS: f64 = 40.0;
/// Pixels a press may move and still count as a click.
const CLICK_SLOP_PX: f64 = 4.0;

/// What a click on the canvas does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Orbit and pick a boid.
    View,
    /// Spawn boids.
    Boids,
    /// Place a goal.
    Goal,
    /// Place an obstacle.
    Obstacle,
    /// A pointer predator follows the pointer while held.
    Predator,
}

impl Mode {
    /// The mode a `data-mode` attribute names.
    pub(crate) fn named(s: &str) -> Option<Self> {
        Some(match s {
            "view" => Mode::View,
            "boids" => Mode::Boids,
            "goal" => Mode::Goal,
            "obstacle" => Mode::Obstacle,
            "predator" => Mode::Predator,
            _ => return None,
        })
    }
}

/// What a command in flight was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// Creating the pointer predator.
    Predator,
    /// Anything else: the label shown when it is done.
    Other(&'static str),
    /// Answers nobody waits for (predator moves).
    Quiet,
}

/// The pointer predator being dragged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drag {
    None,
    /// Asked for; `held` is false once the pointer was released.
    Creating {
        held: bool,
    },
    /// Exists with this id.
    Active(u32),
}

/// A pointer on the canvas.
#[derive(Debug, Clone, Copy)]
struct Touch {
    id: i32,
    x: f64,
    y: f64,
}

/// Everything the viewer holds.
pub(crate) struct App {
    pub(crate) dom: Dom,
    endpoints: Endpoints,
    socket: Option<Socket>,
    /// A socket closed from inside its own callback, dropped later.
    dead_socket: Option<Socket>,
    give_up: bool,
    renderer: Option<Renderer>,
    camera: Option<Camera>,
    hello: Option<Hello>,
    params: Vec<ParamInfo>,
    agents: Option<AgentList>,
    metrics: Option<Metrics>,
    /// What the population field last showed (it follows the flock until
    /// someone types in it).
    population_shown: String,
    stream: Stream,
    inbox: Vec<u8>,
    out: Vec<u8>,
    arrived_ms: f64,
    frame_interval_ms: f64,
    frames: Rate,
    rendered: Rate,
    frames_total: u64,
    ticks: TickLog,
    history: History<PLOT_SAMPLES>,
    latency_ms: Option<f64>,
    trails: bool,
    mode: Mode,
    next_request: u32,
    pending: VecDeque<(u32, Pending)>,
    drag: Drag,
    last_move_ms: f64,
    picked: Option<u32>,
    touches: Vec<Touch>,
    press: Option<(f64, f64, bool)>,
    pinch: Option<f64>,
    status_ticks: u32,
    /// Ask the REST API whether this server replays a recording.
    state_fetch: bool,
    /// The recording's first and last tick, when it does.
    replay: Option<(u64, u64)>,
    /// The seek bar is being dragged: don't move it under the pointer.
    seeking: bool,
    /// On the interest stream (`?budget=` on the page URL), else None.
    interest: Option<Interest>,
    /// How many snapshots a second to ask for (as many as the page takes).
    pace: Pace,
    /// When the oldest latency probe still unanswered went out, ms.
    ping_out: Option<f64>,
    /// Far behind: snapshots are dropped unread until the probe with this
    /// nonce comes back (everything queued before it has then gone by),
    /// then a keyframe is asked for.
    draining: Option<u64>,
    /// A keyframe was asked for (Resync) and has not come: deltas that
    /// miss their base meanwhile ask for no more.
    resync_sent: bool,
    /// When the page last drew, ms.
    drawn_ms: f64,
    /// Where the pointer hovers over the canvas, CSS pixels.
    hover: Option<(f64, f64)>,
    /// The shown frame's tick and boid count, and the flock's centre in it
    /// (clicks land at its depth; worked out once a frame, not per pointer
    /// event; a paused flock's frame changes count, not tick).
    centre: Option<(u64, usize, Vec3)>,
    /// The canvas's mouse pointer now ("crosshair" where a click lands).
    pointer_shown: &'static str,
    /// Ask the server which preset is active.
    presets_stale: bool,
    /// Where the cursor marker was last drawn.
    cursor_at: Option<Vec3>,
}

impl App {
    /// A viewer for the page `dom`, connecting to `endpoints`; on the interest
    /// stream with this budget when `interest` is set (an inner None: as
    /// much as the link drains).
    pub(crate) fn new(dom: Dom, endpoints: Endpoints, interest: Option<Option<u32>>) -> Self {
        Self {
            dom,
            endpoints,
            socket: None,
            dead_socket: None,
            give_up: false,
            renderer: None,
            camera: None,
            hello: None,
            params: Vec::new(),
            agents: None,
            metrics: None,
            population_shown: String::new(),
            stream: Stream::default(),
            inbox: Vec::new(),
            out: Vec::new(),
            arrived_ms: 0.0,
            frame_interval_ms: 1000.0 / f64::from(WANT_FPS),
            frames: Rate::default(),
            rendered: Rate::default(),
            frames_total: 0,
            ticks: TickLog::default(),
            history: History::default(),
            latency_ms: None,
            trails: false,
            mode: Mode::View,
            next_request: 1,
            pending: VecDeque::new(),
            drag: Drag::None,
            last_move_ms: 0.0,
            picked: None,
            touches: Vec::with_capacity(4),
            press: None,
            pinch: None,
            status_ticks: 0,
            state_fetch: false,
            hover: None,
            centre: None,
            pointer_shown: "",
            presets_stale: false,
            cursor_at: None,
            replay: None,
            seeking: false,
            interest: interest.map(Interest::new),
            pace: Pace::new(WANT_FPS),
            ping_out: None,
            draining: None,
            resync_sent: false,
            drawn_ms: 0.0,
        }
    }

    /// Main-thread time spent on the stream (handling a message, drawing),
    /// ms: what the page's pace is measured by.
    pub(crate) fn spent(&mut self, ms: f64) {
        self.pace.spent(ms);
    }

    /// Opens the socket (events go to `handler`).
    pub(crate) fn connect(&mut self, handler: impl Fn(NetEvent) + Clone + 'static) {
        self.dead_socket = None;
        self.dom.connection("connecting…", false);
        match Socket::open(self.endpoints.url(), handler) {
            Ok(s) => self.socket = Some(s),
            Err(e) => self.dom.message(
                &format!("cannot open {}: {e:?}", self.endpoints.url()),
                true,
            ),
        }
    }

    /// Handles a socket event; returns the delay before reconnecting, if
    /// the connection is gone and should be retried.
    pub(crate) fn on_net(&mut self, ev: NetEvent, now_ms: f64) -> Option<u32> {
        match ev {
            NetEvent::Open => {
                self.dom.connection("connected", true);
                if let Some(i) = self.interest.as_mut() {
                    // The view needs the world: subscribe on Hello.
                    i.clear();
                } else {
                    self.subscribe(None);
                }
                None
            }
            NetEvent::Message(buf) => {
                self.on_message(&buf, now_ms);
                None
            }
            NetEvent::Closed { code, reason } => {
                self.dead_socket = self.socket.take();
                self.stream.clear();
                if let Some(i) = self.interest.as_mut() {
                    i.clear();
                }
                // The last frame stays on screen until the next keyframe.
                self.drag = Drag::None;
                self.pending.clear();
                if self.give_up {
                    self.dom.connection("closed", false);
                    return None;
                }
                let wait = self.endpoints.lost(now_ms, js_sys::Math::random());
                self.dom.offline();
                let words = close_words(code, &reason);
                let next = if wait <= crate::net::NEXT_ENDPOINT_MS {
                    format!("{words}; trying the next server")
                } else {
                    format!("{words}; reconnecting in {:.1} s", f64::from(wait) / 1000.0)
                };
                self.dom.connection(&next, false);
                Some(wait)
            }
        }
    }

    fn on_message(&mut self, buf: &ArrayBuffer, now_ms: f64) {
        let bytes = Uint8Array::new(buf);
        if self.draining.is_some() && bytes.length() > 0 && is_flock_message(bytes.get_index(0)) {
            // Stale: counted (the link still carries it), not read.
            self.frames.add(now_ms, f64::from(bytes.length()));
            return;
        }
        let mut inbox = std::mem::take(&mut self.inbox);
        inbox.resize(bytes.length() as usize, 0);
        bytes.copy_to(&mut inbox);
        match decode_server(&inbox) {
            Ok(ServerFrame::Keyframe(k)) => {
                self.resync_sent = false;
                let arrived = self.stream.keyframe(&k);
                self.frame_arrived(arrived.tick, arrived.aligned, inbox.len(), now_ms);
            }
            Ok(ServerFrame::Delta(d)) => match self.stream.delta(&d) {
                Ok(arrived) => {
                    self.frame_arrived(arrived.tick, arrived.aligned, inbox.len(), now_ms)
                }
                Err(_) => {
                    // Missed a base (a skipped frame): ask for a keyframe,
                    // once until it comes.
                    if !self.resync_sent {
                        self.resync_sent = true;
                        self.send(&ClientMsg::Resync);
                    }
                }
            },
            Ok(ServerFrame::Control(msg)) => self.on_control(msg, now_ms),
            Ok(ServerFrame::Cells(b)) => {
                let applied = self.interest.as_mut().map(|i| i.on_batch(b));
                match applied {
                    Some(Ok((tick, aligned))) => {
                        self.frame_arrived(tick, aligned, inbox.len(), now_ms)
                    }
                    Some(Err(_)) => {
                        // A batch that does not apply: start the cells over.
                        if let Some(i) = self.interest.as_mut() {
                            i.start_resync();
                        }
                        self.send(&ClientMsg::Resync);
                    }
                    None => {}
                }
            }
            Err(e) => self
                .dom
                .message(&format!("undecodable message from the server: {e}"), true),
        }
        self.inbox = inbox;
    }

    fn frame_arrived(&mut self, tick: u64, aligned: bool, bytes: usize, now_ms: f64) {
        let dt = now_ms - self.arrived_ms;
        // On the interest stream each boid moves between its own cell's
        // frames, so every batch times the interval; otherwise only one that
        // lists the same boids.
        if (aligned || self.interest.is_some()) && dt > 0.0 {
            self.frame_interval_ms = (0.8 * self.frame_interval_ms + 0.2 * dt).clamp(5.0, 500.0);
        }
        self.arrived_ms = now_ms;
        self.frames.add(now_ms, bytes as f64);
        self.frames_total += 1;
        self.ticks.push(tick);
        match (&mut self.renderer, &self.interest) {
            (Some(r), Some(i)) => r.upload_cells(&i.previous, &i.merged, &i.spans),
            (Some(r), None) => {
                if let Some(f) = self.stream.newest() {
                    r.upload(f, aligned);
                }
            }
            _ => {}
        }
    }

    /// The frame the canvas shows: the merged cells on the interest
    /// stream, else the newest snapshot.
    fn shown(&self) -> Option<&starling_protocol::Frame> {
        match &self.interest {
            Some(i) => i.info.map(|_| &i.merged),
            None => self.stream.newest(),
        }
    }

    /// Sends `Subscribe` with this view (None: the whole-world stream).
    fn subscribe(&mut self, region: Option<starling_protocol::View>) {
        let sub = ClientMsg::Subscribe {
            major: PROTOCOL_MAJOR,
            minor: PROTOCOL_MINOR,
            max_fps: self.pace.asked(),
            region,
        };
        self.send(&sub);
    }

    /// The camera's view when it should be sent (interest stream only).
    fn view_to_send(&mut self, now_ms: f64) -> Option<starling_protocol::View> {
        let (cam, h, i) = (
            self.camera.as_ref()?,
            self.hello.as_ref()?,
            self.interest.as_mut()?,
        );
        let (lo, hi) = cam.view_box();
        let extent = h.world.world_m.iter().copied().fold(1.0, f32::max);
        i.view_to_send(lo, hi, cam.eye(), extent, now_ms)
    }

    fn on_control(&mut self, msg: ServerMsg, now_ms: f64) {
        match msg {
            ServerMsg::Hello(h) => self.on_hello(h, now_ms),
            ServerMsg::Params(p) => {
                if let Err(e) = self.dom.params(&p) {
                    self.dom.message(&e, true);
                }
                self.params = p;
                self.presets_stale = true;
            }
            ServerMsg::Agents(a) => {
                if let Drag::Active(id) = self.drag
                    && !a.predators.iter().any(|p| p.id == id)
                {
                    // It expired or someone removed it.
                    self.drag = Drag::None;
                }
                match self.dom.agents(&a) {
                    // New buttons are gated like the others.
                    Ok(true) => {
                        if let Some(h) = &self.hello {
                            self.dom.gate(h.role, &h.allowed);
                        }
                    }
                    Ok(false) => {}
                    Err(e) => self.dom.message(&e, true),
                }
                self.agents = Some(a);
            }
            ServerMsg::Metrics(m) => {
                self.history.push(m.tick, m.order, m.min_nn_m);
                let tick_hz = self.param("tick_hz").unwrap_or(60.0);
                self.dom.plot(&self.history, tick_hz);
                if let Some(b) = self.dom.doc.get_element_by_id("pause") {
                    b.set_text_content(Some(if m.paused { "Resume" } else { "Pause" }));
                }
                // The population control shows the count, unless being typed in.
                if let Some(input) = self.dom.doc.get_element_by_id("population").and_then(|el| {
                    wasm_bindgen::JsCast::dyn_into::<web_sys::HtmlInputElement>(el).ok()
                }) {
                    // Unless someone typed in it since it was last shown.
                    if input.value() == self.population_shown {
                        self.population_shown = m.population.to_string();
                        input.set_value(&self.population_shown);
                    }
                }
                self.metrics = Some(m);
            }
            ServerMsg::Ack(a) => match self.take_pending(a.request_id) {
                Some(Pending::Predator) => match (self.drag, a.id) {
                    (Drag::Creating { held: true }, Some(id)) => self.drag = Drag::Active(id),
                    (_, Some(id)) => {
                        // Released before the server answered.
                        self.drag = Drag::None;
                        self.command(Command::RemoveAgent { id }, Pending::Quiet);
                    }
                    _ => self.drag = Drag::None,
                },
                Some(Pending::Other(label)) => {
                    let text = match a.id {
                        Some(id) => format!("{label}: done at tick {} (id {id})", a.tick),
                        None => format!("{label}: done at tick {}", a.tick),
                    };
                    self.dom.message(&text, false);
                }
                Some(Pending::Quiet) | None => {}
            },
            ServerMsg::Error(e) => {
                let what = e.request_id.and_then(|id| self.take_pending(id));
                if what == Some(Pending::Predator) {
                    self.drag = Drag::None;
                }
                if what == Some(Pending::Other(PRESET)) {
                    // The menu shows the one chosen: back to the active one.
                    self.presets_stale = true;
                }
                let label = match what {
                    Some(Pending::Other(l)) => l,
                    Some(Pending::Predator | Pending::Quiet) => "predator",
                    None => "server",
                };
                if what.is_none() && e.field.as_deref() == Some("token") {
                    // Said once, where the read-only banner is.
                    self.dom.token_not_recognised();
                    return;
                }
                let text = match &e.field {
                    Some(f) => format!("{label}: refused ({f}): {}", e.detail),
                    None => format!("{label}: refused: {}", e.detail),
                };
                self.dom.message(&text, true);
            }
            ServerMsg::Pong { nonce, .. } => {
                let rtt = now_ms - nonce as f64 / 1000.0;
                self.latency_ms = Some(rtt);
                self.ping_out = None;
                if let Some(i) = self.interest.as_mut() {
                    i.link.probed(rtt);
                }
                if self.draining == Some(nonce) {
                    // The backlog has gone by: start again from a keyframe
                    // (the last frame stays on screen meanwhile; deltas
                    // that come before it miss their base and are refused).
                    self.draining = None;
                    if let Some(i) = self.interest.as_mut() {
                        i.start_resync();
                    }
                    self.resync_sent = true;
                    self.send(&ClientMsg::Resync);
                }
            }
            ServerMsg::Interest(info) => {
                if let Some(i) = self.interest.as_mut() {
                    i.on_info(info);
                }
            }
            ServerMsg::Close(c) => {
                if matches!(
                    c.reason,
                    CloseReason::VersionMismatch | CloseReason::Unauthorized
                ) {
                    self.give_up = true;
                }
                // The whole-world stream is full: the page reopens itself
                // on the interest stream, whose sockets are counted apart
                // (when that one is full too, it retries as after any close).
                if c.reason == CloseReason::Busy && self.interest.is_none() && reopen_on_interest()
                {
                    self.give_up = true;
                }
                self.dom.message(
                    &format!("the server closed the connection: {}", c.detail),
                    true,
                );
            }
        }
    }

    fn on_hello(&mut self, h: Hello, now_ms: f64) {
        self.resync_sent = false;
        self.draining = None;
        self.endpoints.connected(now_ms);
        self.state_fetch = true;
        self.stream.clear();
        self.history.clear();
        let dims = h.world.dims;
        let same_world = self
            .hello
            .as_ref()
            .is_some_and(|old| old.world.dims == dims && old.world.world_m == h.world.world_m);
        if !same_world {
            self.camera = Some(Camera::framing(h.world.world_m, dims));
            self.renderer = None;
        }
        if self.renderer.is_none() {
            match Renderer::new(self.dom.canvas.clone(), dims) {
                Ok(r) => self.renderer = Some(r),
                Err(e) => self.dom.message(&e, true),
            }
        }
        if let Err(e) = self.dom.params(&h.params) {
            self.dom.message(&e, true);
        }
        self.dom.gate(h.role, &h.allowed);
        self.dom.connection(&format!("live · {}", h.server), true);
        // Whatever went wrong before this connection is over.
        self.dom.message("", false);
        self.params = h.params.clone();
        self.hello = Some(h);
        if let Some(budget) = self.interest.as_ref().map(|i| i.link.declared()) {
            // The camera's view, or the whole world if it has none yet.
            let world = self.hello.as_ref().map_or([1.0; 3], |h| h.world.world_m);
            let view = self.view_to_send(0.0).unwrap_or(starling_protocol::View {
                min: [0.0; 3],
                max: world,
                eye: None,
                budget_bytes_per_s: budget,
            });
            self.subscribe(Some(view));
            if let Some(i) = self.interest.as_mut() {
                i.subscribed();
            }
        }
    }

    fn take_pending(&mut self, id: u32) -> Option<Pending> {
        let at = self.pending.iter().position(|(r, _)| *r == id)?;
        self.pending.remove(at).map(|(_, p)| p)
    }

    fn send(&mut self, msg: &ClientMsg) -> bool {
        let Some(s) = &self.socket else { return false };
        if encode_client(msg, &mut self.out).is_err() {
            return false;
        }
        s.send(&self.out)
    }

    /// Sends a command; the answer shows on the message line.
    fn command(&mut self, command: Command, pending: Pending) {
        let request_id = self.next_request;
        self.next_request = self.next_request.wrapping_add(1).max(1);
        if !self.send(&ClientMsg::Command {
            request_id,
            command,
        }) {
            self.dom
                .message("not connected: the command was not sent", true);
            return;
        }
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((request_id, pending));
    }

    fn allowed(&self, kind: starling_protocol::CommandKind) -> bool {
        self.hello
            .as_ref()
            .is_some_and(|h| h.allowed.contains(&kind))
    }

    /// The pause button and the space key.
    pub(crate) fn toggle_pause(&mut self) {
        if !self.allowed(starling_protocol::CommandKind::Control) {
            self.dom.message("pausing needs the operator role", true);
            return;
        }
        if self.metrics.as_ref().is_some_and(|m| m.paused) {
            self.command(Command::Resume, Pending::Other("resume"));
        } else {
            self.command(Command::Pause, Pending::Other("pause"));
        }
    }

    /// The step button.
    pub(crate) fn step(&mut self) {
        self.command(Command::Step { n: 1 }, Pending::Other("step"));
    }

    /// The reset button.
    pub(crate) fn reset(&mut self) {
        self.picked = None;
        self.dom.pick_legend(None);
        self.command(Command::Reset { seed: None }, Pending::Other("reset"));
    }

    /// The trails button and the `t` key; returns the new state.
    pub(crate) fn toggle_trails(&mut self) -> bool {
        self.trails = !self.trails;
        self.trails
    }

    /// A remove button of the agent list.
    pub(crate) fn remove_agent(&mut self, id: u32) {
        self.command(Command::RemoveAgent { id }, Pending::Other("removed"));
    }

    /// The population control: reach `want` boids (one absolute command
    /// from protocol 1.3: new ones placed at random in the world, the
    /// newest removed first; against an older server, boids spawned at the
    /// centre or killed at random, the difference from the last count seen).
    pub(crate) fn set_population(&mut self, typed: &str, want: f64) {
        // The field follows the flock again.
        self.population_shown = typed.to_owned();
        let (Some(h), Some(m)) = (&self.hello, &self.metrics) else {
            self.dom
                .message("not connected: the population is not known yet", true);
            return;
        };
        if !want.is_finite() || want < 0.0 || want.fract() != 0.0 {
            self.dom.message(
                &format!("boids: {want} is not a whole number of boids"),
                true,
            );
            return;
        }
        let (want, have) = (want.min(f64::from(u32::MAX)) as u32, m.population);
        let world = h.world.world_m;
        if h.minor >= starling_protocol::SET_POPULATION_MINOR {
            self.command(
                Command::SetPopulation { count: want },
                Pending::Other("population set"),
            );
        } else if want > have {
            let center = if h.world.dims == 2 {
                [world[0] / 2.0, world[1] / 2.0, 0.0]
            } else {
                world.map(|w| w / 2.0)
            };
            let spread_m = world[0].min(world[1]) / 4.0;
            self.command(
                Command::SpawnBoids {
                    center,
                    count: want - have,
                    spread_m,
                },
                Pending::Other("boids spawned"),
            );
        } else if want < have {
            self.command(
                Command::KillBoids { count: have - want },
                Pending::Other("boids removed"),
            );
        }
    }

    /// The Reset view button and the `h` key: the camera frames the whole
    /// world again, as when the page opened.
    pub(crate) fn reset_view(&mut self) {
        if let Some(h) = &self.hello {
            self.camera = Some(Camera::framing(h.world.world_m, h.world.dims));
        }
    }

    /// A mode button.
    pub(crate) fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// A slider was released at `value`.
    pub(crate) fn set_param(&mut self, name: &str, value: ParamValue) {
        self.command(
            Command::PatchParams {
                changes: vec![(name.to_owned(), value)],
            },
            Pending::Other("parameter change"),
        );
    }

    /// The server's parameter schema arrived: labels and groups, and the
    /// sliders placed on their default-centred scale.
    pub(crate) fn on_schema(&mut self, groups: &[crate::schema::Group]) {
        let shown = self
            .dom
            .schema(groups)
            .and_then(|()| self.dom.params(&self.params));
        if let Err(e) = shown {
            self.dom.message(&e, true);
        }
    }

    /// The presets arrived (with the active one).
    pub(crate) fn on_presets(&mut self, presets: Vec<crate::schema::Preset>) {
        self.dom.presets(&presets);
    }

    /// Whether the preset menu should ask which preset is active (the
    /// parameters changed, or a preset was refused); clears the flag.
    pub(crate) fn take_presets_stale(&mut self) -> bool {
        std::mem::take(&mut self.presets_stale)
    }

    /// The preset menu.
    pub(crate) fn preset(&mut self, name: &str) {
        self.command(
            Command::Preset {
                name: name.to_owned(),
            },
            Pending::Other(PRESET),
        );
    }

    /// The world point under canvas point (`x`, `y`) in CSS pixels: at the
    /// depth of the flock's centre, inside the world box; None when the
    /// point shows no part of the box.
    fn world_point(&self, x: f64, y: f64) -> Option<Vec3> {
        let cam = self.camera.as_ref()?;
        let h = self.hello.as_ref()?;
        let (w, ht) = (
            f64::from(self.dom.canvas.client_width().max(1)),
            f64::from(self.dom.canvas.client_height().max(1)),
        );
        let (nx, ny) = ((x / w * 2.0 - 1.0) as f32, (1.0 - y / ht * 2.0) as f32);
        let centre = match self.centre {
            Some((_, _, c)) => c,
            None => Vec3::from(h.world.world_m) * 0.5,
        };
        cam.click_point(nx, ny, centre)
    }

    /// Keeps the flock's centre for the frame shown: the mean position of
    /// its boids (None before any).
    fn update_centre(&mut self) {
        let Some((f, q)) = self.shown().and_then(|f| Some((f, f.quant?))) else {
            self.centre = None;
            return;
        };
        if f.is_empty() {
            self.centre = None;
            return;
        }
        if self
            .centre
            .is_some_and(|(tick, n, _)| tick == f.tick && n == f.len())
        {
            return;
        }
        let mut sum = [0u64; 3];
        for p in f.pos.chunks_exact(3) {
            for a in 0..3 {
                sum[a] += u64::from(p[a]);
            }
        }
        let n = f.len() as u64;
        let c = Vec3::from(q.dequantize(sum.map(|s| (s / n) as u16)));
        self.centre = Some((f.tick, f.len(), c));
    }

    /// The cursor marker: where a click in the current mode would place
    /// something, and what (None in view mode, off the canvas or outside
    /// the box). The canvas's pointer says whether a click would land.
    fn cursor(&self) -> (Option<(Vec3, Marker)>, &'static str) {
        let placing = !matches!(self.mode, Mode::View) && self.drag == Drag::None;
        let hit = self
            .hover
            .filter(|_| placing)
            .map(|(x, y)| self.world_point(x, y));
        let pointer = match hit {
            None => "",
            Some(Some(_)) => "crosshair",
            Some(None) => "not-allowed",
        };
        (hit.flatten().and_then(|at| self.marker(at)), pointer)
    }

    fn marker(&self, at: Vec3) -> Option<(Vec3, Marker)> {
        let size = self.placement_size();
        let marker = match self.mode {
            Mode::Goal => Marker::Goal,
            Mode::Obstacle => Marker::Sphere(size / OBSTACLE_PER_WORLD),
            Mode::Boids => Marker::Sphere(size / SPREAD_PER_WORLD),
            Mode::Predator => Marker::Predator,
            Mode::View => return None,
        };
        Some((at, marker))
    }

    /// The world's larger horizontal side: what placed things are sized by.
    fn placement_size(&self) -> f32 {
        self.hello
            .as_ref()
            .map_or(100.0, |h| h.world.world_m[0].max(h.world.world_m[1]))
    }

    /// The pointer left the canvas.
    pub(crate) fn pointer_leave(&mut self) {
        self.hover = None;
    }

    fn outside_message(&self) {
        if let Some(h) = &self.hello {
            let [x, y, _] = h.world.world_m;
            self.dom.message(
                &format!("click inside the world box (x 0 ..= {x} m, y 0 ..= {y} m)"),
                true,
            );
        }
    }

    /// A pointer went down on the canvas at CSS pixel (`x`, `y`).
    pub(crate) fn pointer_down(&mut self, id: i32, x: f64, y: f64) {
        self.touches.retain(|t| t.id != id);
        if self.touches.len() < 4 {
            self.touches.push(Touch { id, x, y });
        }
        if self.touches.len() == 2 {
            self.pinch = Some(self.spread());
            self.press = None;
            return;
        }
        self.press = Some((x, y, false));
        if self.mode == Mode::Predator && self.drag == Drag::None {
            let Some(p) = self.world_point(x, y) else {
                self.outside_message();
                return;
            };
            self.drag = Drag::Creating { held: true };
            self.command(
                Command::AddPredator {
                    mode: PredatorMode::Pointer,
                    position: p.into(),
                    ttl_s: Some(POINTER_PREDATOR_TTL_S),
                },
                Pending::Predator,
            );
        }
    }

    fn spread(&self) -> f64 {
        match self.touches.as_slice() {
            [a, b, ..] => ((a.x - b.x).powi(2) + (a.y - b.y).powi(2)).sqrt().max(1.0),
            _ => 1.0,
        }
    }

    /// The pointer moved.
    pub(crate) fn pointer_move(&mut self, id: i32, x: f64, y: f64, now_ms: f64) {
        self.hover = Some((x, y));
        let Some(t) = self.touches.iter_mut().find(|t| t.id == id) else {
            return;
        };
        let (dx, dy) = (x - t.x, y - t.y);
        (t.x, t.y) = (x, y);
        if let Some(before) = self.pinch {
            let now = self.spread();
            if let Some(cam) = &mut self.camera {
                cam.zoom((before / now) as f32);
            }
            self.pinch = Some(now);
            return;
        }
        let Some((px, py, moved)) = self.press else {
            return;
        };
        let moved = moved || (x - px).abs() + (y - py).abs() > CLICK_SLOP_PX;
        self.press = Some((px, py, moved));
        if self.mode == Mode::Predator {
            if let Drag::Active(id) = self.drag
                && now_ms - self.last_move_ms >= MOVE_INTERVAL_MS
                && let Some(p) = self.world_point(x, y)
            {
                self.last_move_ms = now_ms;
                self.command(
                    Command::MoveAgent {
                        id,
                        position: p.into(),
                    },
                    Pending::Quiet,
                );
            }
            return;
        }
        if moved {
            let h = f64::from(self.dom.canvas.client_height()) as f32;
            if let Some(cam) = &mut self.camera {
                cam.drag(dx as f32, dy as f32, h);
            }
        }
    }

    /// The pointer went up (or was cancelled).
    pub(crate) fn pointer_up(&mut self, id: i32, x: f64, y: f64) {
        self.touches.retain(|t| t.id != id);
        if self.touches.len() < 2 {
            self.pinch = None;
        }
        let press = self.press.take();
        if self.mode == Mode::Predator {
            match self.drag {
                Drag::Active(id) => {
                    self.drag = Drag::None;
                    self.command(Command::RemoveAgent { id }, Pending::Quiet);
                }
                Drag::Creating { .. } => self.drag = Drag::Creating { held: false },
                Drag::None => {}
            }
            return;
        }
        if !matches!(press, Some((_, _, false))) {
            return;
        }
        // A click.
        if self.mode == Mode::View {
            self.pick(x, y);
            return;
        }
        let Some(p) = self.world_point(x, y) else {
            self.outside_message();
            return;
        };
        let size = self.placement_size();
        match self.mode {
            Mode::Boids => self.command(
                Command::SpawnBoids {
                    center: p.into(),
                    count: SPAWN_COUNT,
                    spread_m: size / SPREAD_PER_WORLD,
                },
                Pending::Other("add boids"),
            ),
            Mode::Goal => self.command(
                Command::AddGoal {
                    position: p.into(),
                    waypoints: Vec::new(),
                    looping: false,
                    ttl_s: None,
                },
                Pending::Other("goal"),
            ),
            Mode::Obstacle => self.command(
                Command::AddObstacle {
                    shape: Shape::Sphere {
                        center: p.into(),
                        radius_m: size / OBSTACLE_PER_WORLD,
                    },
                    ttl_s: None,
                },
                Pending::Other("obstacle"),
            ),
            Mode::View | Mode::Predator => {}
        }
    }

    /// Picks the boid drawn nearest the click (within a few pixels) to show
    /// its perception radii; a click on empty space clears the pick.
    fn pick(&mut self, x: f64, y: f64) {
        self.picked = None;
        self.dom.pick_legend(None);
        let (Some(cam), Some(f)) = (&self.camera, self.shown()) else {
            return;
        };
        let Some(q) = f.quant else { return };
        let (w, h) = (
            f64::from(self.dom.canvas.client_width().max(1)),
            f64::from(self.dom.canvas.client_height().max(1)),
        );
        let mut best = (12.0f64 * 12.0, None);
        for i in 0..f.len() {
            let p = Vec3::from(q.dequantize(f.position(i)));
            if let Some((nx, ny)) = cam.project(p) {
                let sx = (f64::from(nx) + 1.0) / 2.0 * w;
                let sy = (1.0 - f64::from(ny)) / 2.0 * h;
                let d2 = (sx - x).powi(2) + (sy - y).powi(2);
                if d2 < best.0 {
                    best = (d2, Some(f.ids[i]));
                }
            }
        }
        self.picked = best.1;
        let radii = (
            self.param("sep_radius_m").unwrap_or(0.0),
            self.param("coh_radius_m").unwrap_or(0.0),
        );
        self.dom
            .pick_legend(self.picked.map(|id| (id, radii.0, radii.1)));
    }

    /// Whether the replay range should be fetched (once per hello).
    pub(crate) fn take_state_fetch(&mut self) -> bool {
        std::mem::take(&mut self.state_fetch)
    }

    /// The server replays a recording covering these ticks (or not).
    pub(crate) fn set_replay(&mut self, range: Option<(u64, u64)>) {
        self.replay = range;
        let doc = &self.dom.doc;
        if let Some(el) = doc.get_element_by_id("replay") {
            let _ = if range.is_some() {
                el.remove_attribute("hidden")
            } else {
                el.set_attribute("hidden", "")
            };
        }
        if let (Some((lo, hi)), Some(seek)) = (range, self.seek_input()) {
            seek.set_min(&lo.to_string());
            seek.set_max(&hi.to_string());
        }
    }

    fn seek_input(&self) -> Option<web_sys::HtmlInputElement> {
        use wasm_bindgen::JsCast;
        self.dom.doc.get_element_by_id("seek")?.dyn_into().ok()
    }

    /// The seek bar moved (`done`: released).
    pub(crate) fn seek(&mut self, tick: f64, done: bool) {
        self.seeking = !done;
        if let Some(out) = self.dom.doc.get_element_by_id("seek-value") {
            out.set_text_content(Some(&format!("{tick:.0}")));
        }
        if done && tick.is_finite() && tick >= 0.0 {
            self.command(Command::Seek { tick: tick as u64 }, Pending::Other("seek"));
        }
    }

    /// The mouse wheel.
    pub(crate) fn wheel(&mut self, delta_y: f64) {
        if let Some(cam) = &mut self.camera {
            cam.zoom((delta_y * 0.0015).exp() as f32);
        }
    }

    fn param(&self, name: &str) -> Option<f32> {
        self.params
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| match p.value {
                ParamValue::Number(v) => Some(v as f32),
                ParamValue::Text(_) => None,
            })
    }

    /// Draws a frame. Allocates nothing.
    pub(crate) fn render(&mut self, now_ms: f64, device_pixel_ratio: f64) {
        // A page that had to slow the stream also draws less often, so
        // the browser's own work (compositing) leaves room for messages.
        if let Some(every) = self.pace.draw_every_ms()
            && now_ms - self.drawn_ms < every
        {
            return;
        }
        self.drawn_ms = now_ms;
        let picked = self.picked.and_then(|id| {
            let f = self.shown()?;
            let i = match &self.interest {
                // The merged cells are in cell order, not id order.
                Some(_) => f.ids.iter().position(|&x| x == id)?,
                None => self.stream.index_of(id)?,
            };
            let p = Vec3::from(f.quant?.dequantize(f.position(i)));
            let sep = self.params.iter().find(|p| p.name == "sep_radius_m");
            let coh = self.params.iter().find(|p| p.name == "coh_radius_m");
            let num = |p: Option<&ParamInfo>| match p.map(|p| &p.value) {
                Some(ParamValue::Number(v)) => *v as f32,
                _ => 0.0,
            };
            Some((p, num(sep), num(coh)))
        });
        self.update_centre();
        let (cursor, pointer) = self.cursor();
        if pointer != self.pointer_shown {
            let _ = self.dom.canvas.style().set_property("cursor", pointer);
            self.pointer_shown = pointer;
        }
        self.cursor_at = cursor.map(|(at, _)| at);
        let (Some(r), Some(cam), Some(h)) = (&self.renderer, &mut self.camera, &self.hello) else {
            return;
        };
        cam.set_aspect(r.fit(device_pixel_ratio));
        // The world in the middle of what the panel leaves free (on a wide
        // enough canvas).
        let width = f64::from(self.dom.canvas.client_width().max(1));
        let panel = self
            .dom
            .doc
            .get_element_by_id("panel")
            .map_or(0.0, |p| f64::from(p.client_width()) + 16.0);
        cam.set_shift(if width > 3.0 * panel {
            (-panel / width) as f32
        } else {
            0.0
        });
        let scene = Scene {
            view_proj: cam.view_proj(),
            alpha: ((now_ms - self.arrived_ms) / self.frame_interval_ms) as f32,
            interval_ticks: self.interest.as_ref().map_or(1.0, |i| i.interval_ticks),
            trails: self.trails,
            world: h.world.world_m,
            dims: h.world.dims,
            agents: self.agents.as_ref(),
            blobs: self.interest.as_ref().map_or(&[], |i| &i.blobs),
            picked,
            flee_radius_m: self.param("flee_radius_m").unwrap_or(0.0),
            cursor,
        };
        r.draw(&scene);
        self.rendered.add(now_ms, 1.0);
        // Views follow the camera once subscribed (Subscribe goes first).
        if self.interest.as_ref().is_some_and(Interest::is_subscribed)
            && let Some(view) = self.view_to_send(now_ms)
        {
            self.send(&ClientMsg::SetView(view));
        }
    }

    /// Twice a second: the status line, a latency probe every second, and
    /// the pace (fewer snapshots when the page cannot keep up).
    pub(crate) fn status_tick(&mut self, now_ms: f64) {
        let (fps, _) = self.rendered.per_second(now_ms);
        let (_, bytes) = self.frames.per_second(now_ms);
        let shown = self.shown();
        self.dom.status(&Status {
            fps,
            tick: shown.map(|f| f.tick),
            boids: shown.map(|f| f.len()),
            kbps: bytes / 1000.0,
            budget_kbps: self
                .interest
                .as_ref()
                .and_then(|i| i.info)
                .map(|i| f64::from(i.budget_bytes_per_s) / 1000.0),
            link_lowered: self.interest.as_ref().is_some_and(|i| i.link.lowered()),
            link_starting: self.interest.as_ref().is_some_and(|i| i.link.starting()),
            cells: self.interest.as_ref().map(Interest::counts),
            latency_ms: self.latency_ms,
            asked_fps: self.pace.slowed().then(|| self.pace.asked()),
            frames: self.frames_total,
            role: self.hello.as_ref().map(|h| h.role),
            view_distance: self.camera.as_ref().map(Camera::distance),
            cursor: self.cursor_at,
        });
        self.dom.tick_log(self.ticks.iter());
        if self.replay.is_some()
            && !self.seeking
            && let (Some(seek), Some(f)) = (self.seek_input(), self.stream.newest())
        {
            seek.set_value_as_number(f.tick as f64);
            if let Some(out) = self.dom.doc.get_element_by_id("seek-value") {
                out.set_text_content(Some(&f.tick.to_string()));
            }
        }
        self.status_ticks = self.status_ticks.wrapping_add(1);
        if self.status_ticks.is_multiple_of(2) && self.hello.is_some() {
            // The nonce is the send time in microseconds.
            let nonce = (now_ms * 1000.0) as u64;
            self.send(&ClientMsg::Ping { nonce });
            self.ping_out.get_or_insert(now_ms);
        }
        // A probe still out counts as late as it already is.
        let latency = match (self.latency_ms, self.ping_out) {
            (l, Some(t)) => Some(l.unwrap_or(0.0).max(now_ms - t)),
            (l, None) => l,
        };
        if self.hello.is_some()
            && let Some(max_fps) = self.pace.review(now_ms, latency, self.interest.is_some())
        {
            self.send(&ClientMsg::SetRate { max_fps });
        }
        // On the interest stream the budget follows what the link carries.
        let out_ms = self.ping_out.map(|t| now_ms - t);
        if self.draining.is_none()
            && let Some(view) = self
                .interest
                .as_mut()
                .filter(|i| i.is_subscribed())
                .and_then(|i| i.review_link(now_ms, out_ms, bytes))
        {
            self.send(&ClientMsg::SetView(view));
        }
        if let Some(body) = self.dom.doc.body() {
            // For tests: the page's pace (load, draining, waiting for a keyframe).
            let _ = body.set_attribute(
                "data-pace",
                &format!(
                    "load {:.2} draining {} resync {} latency {:.0}",
                    self.pace.load,
                    self.draining.is_some(),
                    self.resync_sent,
                    latency.unwrap_or(-1.0)
                ),
            );
        }
        // Late (the probe over LATE_MS behind): drop what is queued instead of
        // showing it late.
        if self.hello.is_some()
            && self.draining.is_none()
            && latency.is_some_and(|l| l > crate::pace::LATE_MS)
        {
            let nonce = (now_ms * 1000.0) as u64 + 1;
            self.send(&ClientMsg::Ping { nonce });
            self.draining = Some(nonce);
            self.ping_out.get_or_insert(now_ms);
        }
        if let Some(s) = &self.socket
            && s.buffered() > 1 << 20
        {
            self.dom
                .message("the connection is backed up; commands may be slow", true);
        }
    }
}

/// Reopens the page on the interest stream (`?budget=auto`, the page's
/// other parameters kept); false when it cannot.
fn reopen_on_interest() -> bool {
    let Some(loc) = web_sys::window().map(|w| w.location()) else {
        return false;
    };
    let Ok(params) = loc
        .search()
        .and_then(|s| web_sys::UrlSearchParams::new_with_str(&s))
    else {
        return false;
    };
    params.set("budget", "auto");
    loc.set_search(&String::from(params.to_string())).is_ok()
}
