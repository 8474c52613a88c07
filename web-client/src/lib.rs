//! starling-web: the Starling viewer, Rust compiled to wasm32 and drawing
//! the live flock with WebGL2. `index.html` is the page; this crate is
//! everything it does.
//!
//! # Layout
//! - `lib.rs`: the entry point; wires browser events to [`app`].
//! - `app.rs`: the viewer's state and what each event does.
//! - `net.rs`: the WebSocket, the endpoints and the reconnect backoff.
//! - `pace.rs`: how many snapshots a second the page asks for (as many as
//!   it can handle).
//! - `stream.rs`: keyframes and deltas rebuilt into reused frames.
//! - `render.rs`: WebGL2: instanced boids from the quantised blocks,
//!   interpolated between snapshots; agents, world box, perception radii.
//! - `camera.rs`: the orbit camera and click-to-world rays.
//! - `ui.rs`: the page's controls, status, role gating and plot.
//! - `stats.rs`: rates and bounded histories for the status and plot.
//!
//! Depends on the protocol crate only (of Starling's crates).

mod app;
mod camera;
mod interest;
mod link;
mod net;
mod pace;
mod render;
mod schema;
mod stats;
mod stream;
mod ui;

use std::cell::RefCell;
use std::rc::Rc;

use wasm_bindgen::JsCast;
use wasm_bindgen::prelude::*;
use web_sys::{
    Event, HtmlElement, HtmlInputElement, HtmlSelectElement, KeyboardEvent, PointerEvent,
    WheelEvent, Window,
};

use crate::app::{App, Mode};
use crate::net::{Endpoints, NetEvent};
use starling_protocol::ParamValue;

type Shared = Rc<RefCell<App>>;

/// Starts the viewer (called by wasm-bindgen when the module loads).
#[wasm_bindgen(start)]
pub fn start() -> Result<(), JsValue> {
    let window = web_sys::window().ok_or("no window")?;
    let doc = window.document().ok_or("no document")?;
    let dom = ui::Dom::find(doc).map_err(|e| JsValue::from_str(&e))?;
    let app: Shared = Rc::new(RefCell::new(App::new(
        dom,
        endpoints(&window)?,
        interest_budget(&window)?,
    )));
    wire_controls(&app)?;
    wire_canvas(&app)?;
    wire_keys(&app, &window)?;
    start_render_loop(&app, &window)?;
    start_status_timer(&app, &window)?;
    load_schema(&app);
    connect(&app);
    Ok(())
}

/// Where to stream from: `ws(s)://<this host>/ws`, or the page's
/// `?endpoints=` (edges), each with the page's `?token=` passed on.
fn endpoints(window: &Window) -> Result<Endpoints, JsValue> {
    let loc = window.location();
    let scheme = if loc.protocol()? == "https:" {
        "wss"
    } else {
        "ws"
    };
    let params = web_sys::UrlSearchParams::new_with_str(&loc.search()?)?;
    let query = params.get("token").map_or(String::new(), |t| {
        format!("?token={}", String::from(js_sys::encode_uri_component(&t)))
    });
    let list = params.get("endpoints").unwrap_or_default();
    // Viewers spread over the endpoints by when they loaded.
    let start = now() as usize;
    Ok(Endpoints::new(&loc.host()?, &list, scheme, &query, start))
}

/// `?budget=` on the page URL: the interest stream, with that budget in
/// bytes per second (brought within the protocol's range), or any other
/// word (`auto`) for as much as the link drains; absent or empty, the
/// whole-world stream.
fn interest_budget(window: &Window) -> Result<Option<Option<u32>>, JsValue> {
    use starling_protocol::limits::{MAX_VIEW_BUDGET, MIN_VIEW_BUDGET};
    let params = web_sys::UrlSearchParams::new_with_str(&window.location().search()?)?;
    Ok(params.get("budget").filter(|b| !b.is_empty()).map(|b| {
        b.parse::<u32>()
            .ok()
            .map(|n| n.clamp(MIN_VIEW_BUDGET, MAX_VIEW_BUDGET))
    }))
}

fn now() -> f64 {
    web_sys::window()
        .and_then(|w| w.performance())
        .map_or(0.0, |p| p.now())
}

fn connect(app: &Shared) {
    let weak = Rc::downgrade(app);
    let handler = move |ev: NetEvent| {
        let Some(app) = weak.upgrade() else { return };
        let t0 = now();
        let retry = app.borrow_mut().on_net(ev, t0);
        app.borrow_mut().spent(now() - t0);
        if let Some(ms) = retry {
            let again = app.clone();
            let f = Closure::once_into_js(move || connect(&again));
            if let Some(w) = web_sys::window() {
                let _ = w.set_timeout_with_callback_and_timeout_and_arguments_0(
                    f.unchecked_ref(),
                    ms as i32,
                );
            }
        }
    };
    app.borrow_mut().connect(handler);
}

/// Adds a listener for the page's lifetime.
fn listen<E: wasm_bindgen::convert::FromWasmAbi + 'static>(
    target: &web_sys::EventTarget,
    event: &str,
    f: impl FnMut(E) + 'static,
) -> Result<(), JsValue> {
    let c = Closure::<dyn FnMut(E)>::new(f);
    target.add_event_listener_with_callback(event, c.as_ref().unchecked_ref())?;
    // Page-lifetime listeners: created once, never removed.
    c.forget();
    Ok(())
}

fn element(app: &Shared, id: &str) -> Result<HtmlElement, JsValue> {
    app.borrow()
        .dom
        .doc
        .get_element_by_id(id)
        .ok_or_else(|| JsValue::from_str(&format!("the page has no #{id}")))?
        .dyn_into()
        .map_err(|_| JsValue::from_str(&format!("#{id} is not an HTML element")))
}

fn wire_controls(app: &Shared) -> Result<(), JsValue> {
    let a = app.clone();
    let el = element(app, "pause")?;
    listen(&el, "click", move |_: Event| a.borrow_mut().toggle_pause())?;
    let a = app.clone();
    let el = element(app, "step")?;
    listen(&el, "click", move |_: Event| a.borrow_mut().step())?;
    let a = app.clone();
    let el = element(app, "reset")?;
    listen(&el, "click", move |_: Event| a.borrow_mut().reset())?;
    let a = app.clone();
    let trails = element(app, "trails")?;
    let button = trails.clone();
    listen(&trails, "click", move |_: Event| {
        let on = a.borrow_mut().toggle_trails();
        button.set_class_name(if on { "on" } else { "" });
    })?;
    let a = app.clone();
    let home = element(app, "home")?;
    listen(&home, "click", move |_: Event| a.borrow_mut().reset_view())?;
    // Remove buttons of the agent list: one listener on the list.
    let a = app.clone();
    let agents = element(app, "agents")?;
    listen(&agents, "click", move |e: Event| {
        let id = e
            .target()
            .and_then(|t| t.dyn_into::<web_sys::Element>().ok())
            .and_then(|b| b.get_attribute("data-remove"))
            .and_then(|v| v.parse::<u32>().ok());
        if let Some(id) = id {
            a.borrow_mut().remove_agent(id);
        }
    })?;
    let a = app.clone();
    let set = element(app, "population-set")?;
    let doc = app.borrow().dom.doc.clone();
    listen(&set, "click", move |_: Event| {
        let field = doc
            .get_element_by_id("population")
            .and_then(|el| el.dyn_into::<web_sys::HtmlInputElement>().ok());
        let (typed, want) = field.map_or((String::new(), f64::NAN), |i| {
            (i.value(), i.value_as_number())
        });
        a.borrow_mut().set_population(&typed, want);
    })?;
    // Mode buttons: one listener on their container.
    let a = app.clone();
    let modes = element(app, "modes")?;
    let container = modes.clone();
    listen(&modes, "click", move |e: Event| {
        let Some(b) = e.target().and_then(|t| t.dyn_into::<HtmlElement>().ok()) else {
            return;
        };
        let Some(mode) = b.get_attribute("data-mode").and_then(|m| Mode::named(&m)) else {
            return;
        };
        if b.has_attribute("disabled") {
            return;
        }
        a.borrow_mut().set_mode(mode);
        if let Ok(all) = container.query_selector_all("button") {
            for k in 0..all.length() {
                if let Some(el) = all.item(k).and_then(|n| n.dyn_into::<HtmlElement>().ok()) {
                    el.set_class_name(if el == b { "on" } else { "" });
                }
            }
        }
    })?;
    // Sliders and choices: shown live on input, sent on release.
    let params = element(app, "params")?;
    let a = app.clone();
    listen(&params, "input", move |e: Event| {
        if let Some(input) = e
            .target()
            .and_then(|t| t.dyn_into::<HtmlInputElement>().ok())
            && let Some(name) = input.get_attribute("data-param")
            && let Some(v) = ui::value_of(&input)
        {
            a.borrow().dom.show_value(&name, v);
        }
    })?;
    let a = app.clone();
    listen(&params, "change", move |e: Event| {
        let Some(target) = e.target() else { return };
        let Some(el) = target.dyn_ref::<web_sys::Element>() else {
            return;
        };
        let Some(name) = el.get_attribute("data-param") else {
            return;
        };
        let value = if let Some(input) = target.dyn_ref::<HtmlInputElement>() {
            if !input.has_attribute("data-default") {
                // Without the schema the slider knows neither its default
                // nor whether it takes whole numbers: send nothing.
                a.borrow()
                    .dom
                    .message("the parameters' labels are still loading: try again", true);
                return;
            }
            let Some(v) = ui::value_of(input) else { return };
            ParamValue::Number(v)
        } else if let Some(select) = target.dyn_ref::<HtmlSelectElement>() {
            ParamValue::Text(select.value())
        } else {
            return;
        };
        a.borrow_mut().set_param(&name, value);
    })?;
    let seek = element(app, "seek")?;
    for (event, done) in [("input", false), ("change", true)] {
        let a = app.clone();
        listen(&seek, event, move |e: Event| {
            if let Some(input) = e
                .target()
                .and_then(|t| t.dyn_into::<HtmlInputElement>().ok())
            {
                a.borrow_mut().seek(input.value_as_number(), done);
            }
        })?;
    }
    let a = app.clone();
    let preset = app.borrow().dom.preset.clone();
    listen(&preset.clone(), "change", move |_: Event| {
        // "custom" names no preset; the menu shows the active one again
        // when the server's values come back.
        let name = preset.value();
        if !name.is_empty() {
            a.borrow_mut().preset(&name);
        }
    })?;
    let a = app.clone();
    let el = element(app, "defaults")?;
    listen(&el, "click", move |_: Event| {
        a.borrow_mut().preset("defaults")
    })?;
    Ok(())
}

fn wire_canvas(app: &Shared) -> Result<(), JsValue> {
    let canvas = app.borrow().dom.canvas.clone();
    let a = app.clone();
    let c = canvas.clone();
    listen(&canvas, "pointerdown", move |e: PointerEvent| {
        let _ = c.set_pointer_capture(e.pointer_id());
        a.borrow_mut().pointer_down(
            e.pointer_id(),
            f64::from(e.offset_x()),
            f64::from(e.offset_y()),
        );
    })?;
    let a = app.clone();
    listen(&canvas, "pointermove", move |e: PointerEvent| {
        a.borrow_mut().pointer_move(
            e.pointer_id(),
            f64::from(e.offset_x()),
            f64::from(e.offset_y()),
            now(),
        );
    })?;
    let a = app.clone();
    listen(&canvas, "pointerleave", move |_: PointerEvent| {
        a.borrow_mut().pointer_leave();
    })?;
    for ev in ["pointerup", "pointercancel"] {
        let a = app.clone();
        listen(&canvas, ev, move |e: PointerEvent| {
            a.borrow_mut().pointer_up(
                e.pointer_id(),
                f64::from(e.offset_x()),
                f64::from(e.offset_y()),
            );
        })?;
    }
    let a = app.clone();
    listen(&canvas, "wheel", move |e: WheelEvent| {
        e.prevent_default();
        a.borrow_mut().wheel(e.delta_y());
    })?;
    Ok(())
}

fn wire_keys(app: &Shared, window: &Window) -> Result<(), JsValue> {
    let a = app.clone();
    listen(window, "keydown", move |e: KeyboardEvent| {
        // Keys typed into text belong to it; a slider, button or menu that
        // kept the focus after a click does not take the shortcuts away.
        let target = e
            .target()
            .and_then(|t| t.dyn_into::<web_sys::Element>().ok());
        if target.as_ref().is_some_and(is_text_entry) || e.ctrl_key() || e.meta_key() || e.alt_key()
        {
            return;
        }
        match e.key().as_str() {
            " " => {
                // Not also a click on the focused button or a menu opening.
                e.prevent_default();
                a.borrow_mut().toggle_pause();
            }
            "h" => a.borrow_mut().reset_view(),
            "t" => {
                let on = a.borrow_mut().toggle_trails();
                if let Some(b) = a.borrow().dom.doc.get_element_by_id("trails") {
                    b.set_class_name(if on { "on" } else { "" });
                }
            }
            _ => {}
        }
    })
}

/// Whether an element takes typed text (keys typed there are not shortcuts).
fn is_text_entry(el: &web_sys::Element) -> bool {
    match el.tag_name().as_str() {
        "TEXTAREA" => true,
        "INPUT" => {
            let kind = el
                .get_attribute("type")
                .unwrap_or_default()
                .to_ascii_lowercase();
            matches!(
                kind.as_str(),
                "" | "text" | "search" | "number" | "email" | "password" | "url" | "tel"
            )
        }
        _ => el
            .get_attribute("contenteditable")
            .is_some_and(|v| v != "false"),
    }
}

fn start_render_loop(app: &Shared, window: &Window) -> Result<(), JsValue> {
    type Frame = Rc<RefCell<Option<Closure<dyn FnMut(f64)>>>>;
    let slot: Frame = Rc::new(RefCell::new(None));
    let again = slot.clone();
    let a = app.clone();
    let w = window.clone();
    *slot.borrow_mut() = Some(Closure::new(move |t: f64| {
        let t0 = now();
        a.borrow_mut().render(t, w.device_pixel_ratio());
        a.borrow_mut().spent(now() - t0);
        if let Some(f) = again.borrow().as_ref() {
            let _ = w.request_animation_frame(f.as_ref().unchecked_ref());
        }
    }));
    if let Some(f) = slot.borrow().as_ref() {
        window.request_animation_frame(f.as_ref().unchecked_ref())?;
    }
    Ok(())
}

fn start_status_timer(app: &Shared, window: &Window) -> Result<(), JsValue> {
    let a = app.clone();
    let c = Closure::<dyn FnMut()>::new(move || {
        a.borrow_mut().status_tick(now());
        if a.borrow_mut().take_state_fetch() {
            load_replay_range(&a);
        }
        if a.borrow_mut().take_presets_stale() {
            reload_presets(&a);
        }
    });
    window
        .set_interval_with_callback_and_timeout_and_arguments_0(c.as_ref().unchecked_ref(), 500)?;
    c.forget();
    Ok(())
}

/// `GET path` parsed as JSON; `None` when the request or the parse fails.
async fn fetch_json(path: &str) -> Option<JsValue> {
    let w = web_sys::window()?;
    let resp = wasm_bindgen_futures::JsFuture::from(w.fetch_with_str(path))
        .await
        .ok()?
        .dyn_into::<web_sys::Response>()
        .ok()?;
    wasm_bindgen_futures::JsFuture::from(resp.json().ok()?)
        .await
        .ok()
}

/// Asks `GET /api/v1/state` whether the server replays a recording, and
/// shows the seek bar if so.
fn load_replay_range(app: &Shared) {
    let a = app.clone();
    wasm_bindgen_futures::spawn_local(async move {
        let range = async {
            let json = fetch_json("/api/v1/state").await?;
            let replay = js_sys::Reflect::get(&json, &"replay".into()).ok()?;
            let tick = |k: &str| js_sys::Reflect::get(&replay, &k.into()).ok()?.as_f64();
            Some((tick("start_tick")? as u64, tick("end_tick")? as u64))
        }
        .await;
        a.borrow_mut().set_replay(range);
    });
}

/// Loads the parameters' labels, groups and defaults
/// (`GET /api/v1/params/schema`), then the presets
/// (`GET /api/v1/params/presets`).
fn load_schema(app: &Shared) {
    let a = app.clone();
    wasm_bindgen_futures::spawn_local(async move {
        match fetch_json("/api/v1/params/schema")
            .await
            .and_then(|j| parse_groups(&j))
        {
            Some(groups) => a.borrow_mut().on_schema(&groups),
            None => a
                .borrow()
                .dom
                .message("could not load the parameters' labels", true),
        }
        match fetch_presets().await {
            Some(presets) => a.borrow_mut().on_presets(presets),
            None => a
                .borrow()
                .dom
                .message("could not load the preset list", true),
        }
    });
}

fn field(o: &JsValue, k: &str) -> JsValue {
    js_sys::Reflect::get(o, &k.into()).unwrap_or(JsValue::UNDEFINED)
}

fn text(o: &JsValue, k: &str) -> Option<String> {
    field(o, k).as_string()
}

fn items(o: &JsValue) -> Option<Vec<JsValue>> {
    Some(o.clone().dyn_into::<js_sys::Array>().ok()?.iter().collect())
}

fn parse_groups(json: &JsValue) -> Option<Vec<schema::Group>> {
    items(json)?
        .iter()
        .map(|g| {
            Some(schema::Group {
                name: text(g, "name")?,
                label: text(g, "label")?,
                collapsed: field(g, "collapsed").as_bool()?,
                params: items(&field(g, "params"))?
                    .iter()
                    .map(|d| {
                        Some(schema::ParamDoc {
                            name: text(d, "name")?,
                            label: text(d, "label")?,
                            unit: text(d, "unit")?,
                            help: text(d, "help")?,
                            default: field(d, "default").as_f64(),
                            integer: field(d, "integer").as_bool()?,
                            models: items(&field(d, "models"))
                                .map(|ms| ms.iter().filter_map(|m| m.as_string()).collect())
                                .unwrap_or_default(),
                        })
                    })
                    .collect::<Option<Vec<_>>>()?,
            })
        })
        .collect()
}

/// `GET /api/v1/params/presets`, parsed; None when it fails.
async fn fetch_presets() -> Option<Vec<schema::Preset>> {
    parse_presets(&fetch_json("/api/v1/params/presets").await?)
}

fn parse_presets(json: &JsValue) -> Option<Vec<schema::Preset>> {
    items(json)?
        .iter()
        .map(|p| {
            Some(schema::Preset {
                name: text(p, "name")?,
                description: text(p, "description")?,
                active: field(p, "active").as_bool()?,
            })
        })
        .collect()
}

/// Asks `GET /api/v1/params/presets` again: which preset is active after a
/// change (or after a preset was refused).
fn reload_presets(app: &Shared) {
    let a = app.clone();
    wasm_bindgen_futures::spawn_local(async move {
        if let Some(presets) = fetch_presets().await {
            a.borrow_mut().on_presets(presets);
        }
    });
}
