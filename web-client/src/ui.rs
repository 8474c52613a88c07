//! The page around the canvas: the status line, the message line, the
//! parameter sliders (built from the server's parameter list), the
//! buttons, role gating and the live plot. The layout is `index.html`;
//! this file finds its elements and keeps them up to date.

use starling_protocol::{AgentList, CommandKind, ParamInfo, ParamValue, Role};
use wasm_bindgen::JsCast;
use web_sys::{
    CanvasRenderingContext2d, Document, Element, HtmlCanvasElement, HtmlElement, HtmlInputElement,
    HtmlSelectElement,
};

use crate::schema::{self, Group, ParamDoc, SLIDER_STEPS, Scale};
use crate::stats::History;

/// Samples in the live plot.
pub(crate) const PLOT_SAMPLES: usize = 240;

/// The elements the viewer updates.
pub(crate) struct Dom {
    /// The server did not recognise the page's token (the banner says so,
    /// whatever later gating says).
    token_refused: std::cell::Cell<bool>,
    pub(crate) doc: Document,
    pub(crate) canvas: HtmlCanvasElement,
    message: HtmlElement,
    conn: HtmlElement,
    fields: [HtmlElement; 7],
    params: HtmlElement,
    /// The server's groups, labels, units, help lines and defaults, once loaded.
    docs: std::cell::RefCell<Vec<Group>>,
    pub(crate) preset: HtmlSelectElement,
    plot: HtmlCanvasElement,
    legend_order: HtmlElement,
    legend_nn: HtmlElement,
}

/// One status line's worth of figures.
pub(crate) struct Status {
    pub(crate) fps: f64,
    pub(crate) tick: Option<u64>,
    pub(crate) boids: Option<usize>,
    pub(crate) kbps: f64,
    /// The interest stream's budget, kB/s.
    pub(crate) budget_kbps: Option<f64>,
    /// The page lowered its budget to what its link carries.
    pub(crate) link_lowered: bool,
    /// The page is still starting: its budget rises to the given one.
    pub(crate) link_starting: bool,
    /// The interest stream's cells: held in full, drawn as summaries.
    pub(crate) cells: Option<(usize, usize)>,
    pub(crate) latency_ms: Option<f64>,
    /// The snapshots a second the page asks for, when it slowed the stream.
    pub(crate) asked_fps: Option<u16>,
    pub(crate) frames: u64,
    pub(crate) role: Option<Role>,
    /// The camera's distance from what it orbits, metres.
    pub(crate) view_distance: Option<f32>,
    /// Where a click would place something (the cursor marker).
    pub(crate) cursor: Option<glam::Vec3>,
}

fn by_id<T: JsCast>(doc: &Document, id: &str) -> Result<T, String> {
    doc.get_element_by_id(id)
        .ok_or_else(|| format!("the page has no #{id}"))?
        .dyn_into()
        .map_err(|_| format!("#{id} is not the expected element"))
}

impl Dom {
    /// Finds the page's elements.
    pub(crate) fn find(doc: Document) -> Result<Self, String> {
        let f = |id: &str| by_id::<HtmlElement>(&doc, id);
        Ok(Self {
            token_refused: std::cell::Cell::new(false),
            canvas: by_id(&doc, "view")?,
            message: f("message")?,
            conn: f("st-conn")?,
            fields: [
                f("st-fps")?,
                f("st-tick")?,
                f("st-boids")?,
                f("st-kbps")?,
                f("st-latency")?,
                f("st-frames")?,
                f("st-role")?,
            ],
            params: f("params")?,
            docs: std::cell::RefCell::default(),
            preset: by_id(&doc, "preset")?,
            plot: by_id(&doc, "plot")?,
            legend_order: f("lg-order")?,
            legend_nn: f("lg-nn")?,
            doc,
        })
    }

    /// Shows a message; errors in red.
    pub(crate) fn message(&self, text: &str, error: bool) {
        self.message.set_text_content(Some(text));
        self.message
            .set_class_name(if error { "error" } else { "" });
    }

    /// Shows the connection state.
    pub(crate) fn connection(&self, text: &str, ok: bool) {
        self.conn.set_text_content(Some(text));
        self.conn.set_class_name(if ok { "ok" } else { "bad" });
    }

    /// Updates the status line.
    pub(crate) fn status(&self, s: &Status) {
        let dash = || "–".to_owned();
        let texts = [
            match s.asked_fps {
                Some(a) => format!("{:.0} (busy: asks {a}/s)", s.fps),
                None => format!("{:.0}", s.fps),
            },
            s.tick.map_or_else(dash, |t| t.to_string()),
            s.boids.map_or_else(dash, |n| n.to_string()),
            match s.budget_kbps {
                Some(b) if s.link_lowered => format!("{:.1} / {b:.0} (link)", s.kbps),
                Some(b) if s.link_starting => format!("{:.1} / {b:.0} (starting)", s.kbps),
                Some(b) => format!("{:.1} / {b:.0}", s.kbps),
                None => format!("{:.1}", s.kbps),
            },
            s.latency_ms.map_or_else(dash, |l| format!("{l:.0} ms")),
            s.frames.to_string(),
            s.role.map_or_else(dash, |r| r.name().to_owned()),
        ];
        for (el, text) in self.fields.iter().zip(texts) {
            el.set_text_content(Some(&text));
        }
        // For tests: the rate the page asks for (when it slowed it).
        if let Some(body) = self.doc.body() {
            let _ = match s.asked_fps {
                Some(a) => body.set_attribute("data-asked-fps", &a.to_string()),
                None => body.remove_attribute("data-asked-fps"),
            };
        }
        // For tests: where a click would land, on <body>.
        if let Some(body) = self.doc.body() {
            let _ = match s.cursor {
                Some(at) => body.set_attribute(
                    "data-cursor",
                    &format!("{:.2} {:.2} {:.2}", at.x, at.y, at.z),
                ),
                None => body.remove_attribute("data-cursor"),
            };
        }
        // For tests: the camera's zoom on <body>.
        if let (Some(body), Some(d)) = (self.doc.body(), s.view_distance) {
            let _ = body.set_attribute("data-view-distance", &format!("{d:.2}"));
        }
        // For tests: the interest stream's figures on <body>.
        if let (Some(body), Some((held, blobs))) = (self.doc.body(), s.cells) {
            let _ = body.set_attribute("data-cells", &format!("{held} {blobs}"));
            let _ = body.set_attribute("data-kbps", &format!("{:.1}", s.kbps));
        }
    }

    /// Records the ticks of the last frames on `<body data-ticks>`, for
    /// tests that compare what two pages saw.
    pub(crate) fn tick_log(&self, ticks: impl Iterator<Item = u64>) {
        let mut s = String::new();
        for t in ticks {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(&t.to_string());
        }
        if let Some(body) = self.doc.body() {
            let _ = body.set_attribute("data-ticks", &s);
        }
    }

    /// Builds (first time) or updates the sliders and choices, and shows
    /// only the parameters the live model uses.
    pub(crate) fn params(&self, params: &[ParamInfo]) -> Result<(), String> {
        for p in params {
            let id = format!("param-{}", p.name);
            let input = match self.doc.get_element_by_id(&id) {
                Some(el) => el,
                None => self.param_row(p, &id)?,
            };
            match &p.value {
                ParamValue::Number(v) => {
                    let Ok(input) = input.dyn_into::<HtmlInputElement>() else {
                        continue;
                    };
                    let (min, max) = (p.min.unwrap_or(0.0), p.max.unwrap_or(1.0));
                    for (k, v) in [("data-min", min), ("data-max", max)] {
                        let _ = input.set_attribute(k, &v.to_string());
                    }
                    input.set_min("0");
                    input.set_max(&SLIDER_STEPS.to_string());
                    input.set_step("1");
                    if let Some(scale) = scale_of(&input) {
                        input.set_value_as_number(scale.position(*v));
                    }
                    self.show_value(&p.name, *v);
                }
                ParamValue::Text(t) => {
                    if let Ok(select) = input.dyn_into::<HtmlSelectElement>() {
                        select.set_value(t);
                    }
                }
            }
        }
        let model = params.iter().find_map(|p| match (&p.name[..], &p.value) {
            ("model", ParamValue::Text(m)) => Some(m.as_str()),
            _ => None,
        });
        if let Some(model) = model {
            self.show_model(model);
        }
        Ok(())
    }

    /// Labels, groups and tooltips from the server's parameter schema: a
    /// collapsible section per group; rows already built move into theirs.
    /// Call [`Dom::params`] afterwards to place the sliders on the new scale.
    pub(crate) fn schema(&self, groups: &[Group]) -> Result<(), String> {
        let js = |e: wasm_bindgen::JsValue| format!("{e:?}");
        for g in groups {
            let id = format!("group-{}", g.name);
            if self.doc.get_element_by_id(&id).is_some() {
                continue;
            }
            let details = self.doc.create_element("details").map_err(js)?;
            details.set_id(&id);
            details.set_class_name("group");
            if !g.collapsed {
                details.set_attribute("open", "").map_err(js)?;
            }
            let summary = self.doc.create_element("summary").map_err(js)?;
            summary.set_text_content(Some(&g.label));
            details.append_child(&summary).map_err(js)?;
            self.params.append_child(&details).map_err(js)?;
            for d in &g.params {
                if let Some(input) = self.doc.get_element_by_id(&format!("param-{}", d.name))
                    && let Some(row) = input.parent_element()
                {
                    self.describe_row(&row, &input, d)?;
                    details.append_child(&row).map_err(js)?;
                }
            }
        }
        *self.docs.borrow_mut() = groups.to_vec();
        Ok(())
    }

    /// Hides the rows of parameters `model` does not use, and the groups
    /// left empty (Reynolds' weights under a drone model, its terms under
    /// the others).
    fn show_model(&self, model: &str) {
        for g in self.docs.borrow().iter() {
            let mut shown = 0;
            for d in &g.params {
                let acts = d.acts_under(model);
                shown += usize::from(acts);
                if let Some(row) = self
                    .doc
                    .get_element_by_id(&format!("param-{}", d.name))
                    .and_then(|input| input.parent_element())
                {
                    set_hidden(&row, !acts);
                }
            }
            if let Some(group) = self.doc.get_element_by_id(&format!("group-{}", g.name)) {
                set_hidden(&group, shown == 0);
            }
        }
        if let Some(body) = self.doc.body() {
            let _ = body.set_attribute("data-model", model);
        }
    }

    /// A row's label, tooltip, default and whole-number flag from its doc.
    fn describe_row(&self, row: &Element, input: &Element, d: &ParamDoc) -> Result<(), String> {
        let js = |e: wasm_bindgen::JsValue| format!("{e:?}");
        if let Some(label) = row.query_selector("label").map_err(js)? {
            label.set_text_content(Some(&d.title()));
        }
        row.set_attribute("title", &d.help).map_err(js)?;
        if let Some(v) = d.default {
            input
                .set_attribute("data-default", &v.to_string())
                .map_err(js)?;
        }
        if d.integer {
            input.set_attribute("data-int", "").map_err(js)?;
        }
        Ok(())
    }

    fn param_row(&self, p: &ParamInfo, id: &str) -> Result<Element, String> {
        let js = |e: wasm_bindgen::JsValue| format!("{e:?}");
        let row = self.doc.create_element("div").map_err(js)?;
        row.set_class_name("row");
        let label = self.doc.create_element("label").map_err(js)?;
        label.set_attribute("for", id).map_err(js)?;
        label.set_text_content(Some(&p.name));
        row.append_child(&label).map_err(js)?;
        let input = match &p.value {
            ParamValue::Number(_) => {
                let input = self.doc.create_element("input").map_err(js)?;
                input.set_attribute("type", "range").map_err(js)?;
                input
            }
            ParamValue::Text(_) => {
                let select = self.doc.create_element("select").map_err(js)?;
                for c in &p.choices {
                    let o = self.doc.create_element("option").map_err(js)?;
                    o.set_attribute("value", c).map_err(js)?;
                    o.set_text_content(Some(c));
                    select.append_child(&o).map_err(js)?;
                }
                select
            }
        };
        input.set_id(id);
        input.set_attribute("data-param", &p.name).map_err(js)?;
        input.set_attribute("data-needs", "Params").map_err(js)?;
        row.append_child(&input).map_err(js)?;
        if matches!(p.value, ParamValue::Number(_)) {
            let out = self.doc.create_element("output").map_err(js)?;
            out.set_id(&format!("value-{}", p.name));
            row.append_child(&out).map_err(js)?;
        }
        let found = self.docs.borrow().iter().find_map(|g| {
            let d = g.params.iter().find(|d| d.name == p.name)?;
            Some((g.name.clone(), d.clone()))
        });
        match found
            .as_ref()
            .and_then(|(g, _)| self.doc.get_element_by_id(&format!("group-{g}")))
        {
            Some(group) => group.append_child(&row).map_err(js)?,
            None => self.params.append_child(&row).map_err(js)?,
        };
        if let Some((_, d)) = &found {
            self.describe_row(&row, &input, d)?;
        }
        Ok(input)
    }

    /// Shows a slider's live value next to it.
    pub(crate) fn show_value(&self, name: &str, v: f64) {
        if let Some(out) = self.doc.get_element_by_id(&format!("value-{name}")) {
            let text = if v.fract() == 0.0 && v.abs() < 1e6 {
                format!("{v:.0}")
            } else if v.abs() >= 100.0 {
                format!("{v:.1}")
            } else {
                format!("{v:.2}")
            };
            out.set_text_content(Some(&text));
        }
    }

    /// Fills the preset menu (each with its description as a tooltip) and
    /// shows the active one, or "custom".
    pub(crate) fn presets(&self, presets: &[schema::Preset]) {
        if self.preset.length() <= 1 {
            for p in presets {
                if let Ok(o) = self.doc.create_element("option") {
                    let _ = o.set_attribute("value", &p.name);
                    let _ = o.set_attribute("title", &p.description);
                    o.set_text_content(Some(&p.name));
                    let _ = self.preset.append_child(&o);
                }
            }
        }
        let active = presets
            .iter()
            .find(|p| p.active)
            .map_or("", |p| p.name.as_str());
        self.preset.set_value(active);
    }

    /// Lists the agents, each with a remove button (`data-remove` its id,
    /// gated by its kind), rebuilding only when the set of agents changed.
    pub(crate) fn agents(&self, list: &AgentList) -> Result<bool, String> {
        let js = |e: wasm_bindgen::JsValue| format!("{e:?}");
        let el = by_id::<HtmlElement>(&self.doc, "agents")?;
        let mut rows: Vec<(u32, &'static str, &'static str)> = Vec::new();
        rows.extend(
            list.predators
                .iter()
                .map(|p| (p.id, "predator", "Predator")),
        );
        rows.extend(list.goals.iter().map(|g| (g.id, "goal", "Goal")));
        rows.extend(
            list.obstacles
                .iter()
                .map(|o| (o.id, "obstacle", "Obstacle")),
        );
        let key: String = rows.iter().map(|r| format!("{} ", r.0)).collect();
        if el.get_attribute("data-ids").as_deref() == Some(key.as_str()) {
            return Ok(false);
        }
        let _ = el.set_attribute("data-ids", &key);
        el.set_inner_html("");
        if rows.is_empty() {
            let none = self.doc.create_element("span").map_err(js)?;
            none.set_class_name("none");
            none.set_text_content(Some("none"));
            el.append_child(&none).map_err(js)?;
        }
        for (id, what, needs) in rows {
            let row = self.doc.create_element("div").map_err(js)?;
            row.set_class_name("agent");
            let label = self.doc.create_element("span").map_err(js)?;
            label.set_text_content(Some(&format!("{what} {id}")));
            let remove = self.doc.create_element("button").map_err(js)?;
            remove.set_text_content(Some("remove"));
            remove
                .set_attribute("data-remove", &id.to_string())
                .map_err(js)?;
            remove.set_attribute("data-needs", needs).map_err(js)?;
            row.append_child(&label).map_err(js)?;
            row.append_child(&remove).map_err(js)?;
            el.append_child(&row).map_err(js)?;
        }
        Ok(true)
    }

    /// Disables every control while there is no connection (the next
    /// `Hello` gates them by role again).
    pub(crate) fn offline(&self) {
        let Ok(list) = self.doc.query_selector_all("[data-needs]") else {
            return;
        };
        let why = "not connected to the server: waiting to reconnect";
        for k in 0..list.length() {
            if let Some(el) = list.item(k).and_then(|n| n.dyn_into::<HtmlElement>().ok()) {
                let _ = el.set_attribute("disabled", "");
                let _ = el.set_attribute("data-why", why);
                let _ = el.set_attribute("title", why);
            }
        }
    }

    /// The server did not recognise the page's token: the banner says so
    /// (the page watches read-only).
    pub(crate) fn token_not_recognised(&self) {
        self.token_refused.set(true);
        if let Some(banner) = self.doc.get_element_by_id("banner") {
            banner.set_text_content(Some(
                "Token not recognised: the ?token= on the page address matches none the \
                 server knows, so this page watches read-only. Check it for typos, or ask \
                 the operator for a pilot or operator token.",
            ));
            let _ = banner.remove_attribute("hidden");
        }
    }

    /// Enables the controls `allowed` lists and disables the others with a
    /// tooltip naming the role needed.
    pub(crate) fn gate(&self, role: Role, allowed: &[CommandKind]) {
        // Say so once, not only in each control's tooltip.
        if self.token_refused.get() && role == Role::Viewer {
            self.token_not_recognised();
        } else if let Some(banner) = self.doc.get_element_by_id("banner") {
            let read_only = role == Role::Viewer;
            let _ = if read_only {
                banner.set_text_content(Some(
                    "Watching read-only: changing the flock needs a pilot or operator \
                     token (?token=… on the page address)",
                ));
                banner.remove_attribute("hidden")
            } else {
                banner.set_attribute("hidden", "")
            };
        }
        let Ok(list) = self.doc.query_selector_all("[data-needs]") else {
            return;
        };
        for k in 0..list.length() {
            let Some(el) = list.item(k).and_then(|n| n.dyn_into::<HtmlElement>().ok()) else {
                continue;
            };
            let needs = el.get_attribute("data-needs").unwrap_or_default();
            let kind = kind_named(&needs);
            let ok = kind.is_some_and(|k| allowed.contains(&k));
            let _ = if ok {
                el.remove_attribute("disabled")
            } else {
                el.set_attribute("disabled", "")
            };
            let why = format!(
                "needs the {} role; you are {}",
                kind.map_or("operator", needed_role),
                role.name()
            );
            if ok {
                if el.get_attribute("data-why").is_some() {
                    let _ = el.remove_attribute("data-why");
                }
            } else {
                let _ = el.set_attribute("data-why", &why);
                let _ = el.set_attribute("title", &why);
            }
        }
    }

    /// Redraws the plot and its legend: order (0 ..= 1, left axis, green)
    /// and the smallest distance between boids (0 ..= the largest shown,
    /// right axis, blue) over the last minute (time axis below).
    pub(crate) fn plot(&self, h: &History<PLOT_SAMPLES>, tick_hz: f32) {
        let w = f64::from(self.plot.client_width().max(1));
        let ht = f64::from(self.plot.client_height().max(1));
        if self.plot.width() != w as u32 {
            self.plot.set_width(w as u32);
            self.plot.set_height(ht as u32);
        }
        let Some(ctx) = self
            .plot
            .get_context("2d")
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into::<CanvasRenderingContext2d>().ok())
        else {
            return;
        };
        ctx.clear_rect(0.0, 0.0, w, ht);
        let max_nn = h.iter().map(|(_, d)| d).fold(1e-3f32, f32::max);
        // The plotting area, inside room for the axis labels.
        let (left, right, top, bottom) = (26.0, w - 34.0, 5.0, ht - 14.0);
        let y_of = |v: f64| bottom - v.clamp(0.0, 1.0) * (bottom - top);
        ctx.set_font("10px sans-serif");
        ctx.set_line_width(1.0);
        for (frac, order_label) in [(0.0, "0"), (0.5, "0.5"), (1.0, "1")] {
            let y = y_of(frac);
            ctx.set_stroke_style_str("#273048");
            ctx.begin_path();
            ctx.move_to(left, y);
            ctx.line_to(right, y);
            ctx.stroke();
            ctx.set_fill_style_str("#7be08a");
            ctx.set_text_align("right");
            let _ = ctx.fill_text(order_label, left - 3.0, y + 3.5);
            ctx.set_fill_style_str("#6cc4ff");
            ctx.set_text_align("left");
            let nn = format!("{:.1} m", f64::from(max_nn) * frac);
            let _ = ctx.fill_text(&nn, right + 3.0, y + 3.5);
        }
        let span_s = h.span_ticks() as f64 / f64::from(tick_hz.max(1.0));
        ctx.set_fill_style_str("#8a93a8");
        ctx.set_text_align("left");
        let _ = ctx.fill_text(&format!("−{span_s:.0} s"), left, ht - 2.0);
        ctx.set_text_align("right");
        let _ = ctx.fill_text("now", right, ht - 2.0);
        let dx = (right - left) / (PLOT_SAMPLES - 1) as f64;
        // The newest sample at the right edge.
        let skip = PLOT_SAMPLES - h.iter().count();
        for (series, color) in [(0, "#7be08a"), (1, "#6cc4ff")] {
            ctx.begin_path();
            ctx.set_stroke_style_str(color);
            for (k, (order, nn)) in h.iter().enumerate() {
                let v = if series == 0 { order } else { nn / max_nn };
                let (x, y) = (left + (skip + k) as f64 * dx, y_of(f64::from(v)));
                if k == 0 {
                    ctx.move_to(x, y);
                } else {
                    ctx.line_to(x, y);
                }
            }
            ctx.stroke();
        }
        if let Some((order, nn)) = h.iter().last() {
            self.legend_order
                .set_text_content(Some(&format!("{order:.2}")));
            self.legend_nn.set_text_content(Some(&format!("{nn:.2} m")));
        }
    }

    /// Names the two spheres drawn around a picked boid (None: none picked).
    pub(crate) fn pick_legend(&self, picked: Option<(u32, f32, f32)>) {
        let Some(el) = self.doc.get_element_by_id("pick-legend") else {
            return;
        };
        match picked {
            Some((id, sep, coh)) => {
                el.set_inner_html(&format!(
                    "boid {id}: <b class=\"sep\">○ separation {sep:.1} m</b> \
                     <b class=\"coh\">○ cohesion {coh:.1} m</b>"
                ));
                let _ = el.remove_attribute("hidden");
            }
            None => {
                let _ = el.set_attribute("hidden", "");
            }
        }
    }
}

/// The value an input slider stands for (its range in `data-min`,
/// `data-max`, its default in `data-default`, whole numbers when
/// `data-int`).
pub(crate) fn value_of(input: &HtmlInputElement) -> Option<f64> {
    Some(scale_of(input)?.value(input.value_as_number(), input.has_attribute("data-int")))
}

fn scale_of(input: &HtmlInputElement) -> Option<Scale> {
    let num = |k: &str| input.get_attribute(k)?.parse::<f64>().ok();
    Some(Scale::new(
        num("data-min")?,
        num("data-max")?,
        num("data-default"),
    ))
}

fn kind_named(name: &str) -> Option<CommandKind> {
    Some(match name {
        "Predator" => CommandKind::Predator,
        "Goal" => CommandKind::Goal,
        "Obstacle" => CommandKind::Obstacle,
        "Boids" => CommandKind::Boids,
        "Params" => CommandKind::Params,
        "Control" => CommandKind::Control,
        _ => return None,
    })
}

/// The least role that may do `kind` (as the server's `auth.rs` decides).
fn needed_role(kind: CommandKind) -> &'static str {
    match kind {
        CommandKind::Predator | CommandKind::Goal | CommandKind::Obstacle => "pilot",
        CommandKind::Boids | CommandKind::Params | CommandKind::Control => "operator",
    }
}

/// Shows or hides an element (the `hidden` attribute).
fn set_hidden(el: &Element, hidden: bool) {
    let _ = if hidden {
        el.set_attribute("hidden", "")
    } else {
        el.remove_attribute("hidden")
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gated_kind_names_a_role() {
        for k in ["Predator", "Goal", "Obstacle", "Boids", "Params", "Control"] {
            assert!(kind_named(k).is_some(), "{k}");
        }
        assert_eq!(needed_role(CommandKind::Goal), "pilot");
        assert_eq!(needed_role(CommandKind::Control), "operator");
    }
}
