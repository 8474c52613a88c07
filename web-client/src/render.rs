//! WebGL2 drawing. Boids are one instanced draw call: a cone (3-D) or a
//! triangle (2-D) per boid, placed and oriented in the vertex shader from
//! the snapshot's quantised blocks as they arrived (`u16` positions,
//! octahedral heading bytes), interpolated between the previous frame and
//! the newest. Agents, the world box and the picked boid's perception
//! radii are line and triangle shapes drawn with one small program.
//!
//! Per frame nothing is allocated: buffers are uploaded only when a
//! snapshot arrives, and uniforms are set from stack arrays.

use glam::{Mat4, Vec3};
use starling_protocol::{AgentList, Frame, QuantBox, Shape};
use wasm_bindgen::JsCast;
use web_sys::{
    HtmlCanvasElement, WebGl2RenderingContext as Gl, WebGlBuffer, WebGlProgram, WebGlShader,
    WebGlUniformLocation, WebGlVertexArrayObject,
};

const BOID_VS: &str = r#"#version 300 es
layout(location = 0) in vec3 a_local;
layout(location = 1) in vec3 a_normal;
layout(location = 2) in vec3 a_prev;
layout(location = 3) in vec3 a_curr;
layout(location = 4) in vec2 a_hprev;
layout(location = 5) in vec2 a_hcurr;
layout(location = 6) in vec2 a_span;
uniform mat4 u_vp;
uniform vec3 u_origin;
uniform vec3 u_extent;
uniform float u_time;
uniform float u_size;
out vec3 v_color;

vec3 oct(vec2 h) {
    vec2 e = h / 255.0 * 2.0 - 1.0;
    float z = 1.0 - abs(e.x) - abs(e.y);
    if (z < 0.0) {
        e = (1.0 - abs(e.yx)) * vec2(e.x >= 0.0 ? 1.0 : -1.0, e.y >= 0.0 ? 1.0 : -1.0);
    }
    return normalize(vec3(e, z));
}

void main() {
    // A jump of more than a quarter of the box is a wrap: no sliding across.
    bool jump = any(greaterThan(abs(a_curr - a_prev), vec3(0.25)));
    // The time shown between this boid's two frames (at times a_span);
    // past the newest it carries on, at most one of its own intervals.
    float a = clamp((u_time - a_span.x) / max(a_span.y - a_span.x, 1e-3), 0.0, 2.0);
    vec3 p = u_origin + (jump ? a_curr : mix(a_prev, a_curr, a)) * u_extent;
    vec3 hc = oct(a_hcurr);
    vec3 f = mix(oct(a_hprev), hc, a);
    f = length(f) < 1e-3 ? hc : normalize(f);
    vec3 up = abs(f.z) > 0.99 ? vec3(1.0, 0.0, 0.0) : vec3(0.0, 0.0, 1.0);
    vec3 r = normalize(cross(f, up));
    vec3 u = cross(r, f);
    vec3 world = p + u_size * (f * a_local.x + r * a_local.y + u * a_local.z);
    vec3 n = normalize(f * a_normal.x + r * a_normal.y + u * a_normal.z);
    float light = 0.5 + 0.5 * max(dot(n, normalize(vec3(0.4, 0.3, 0.85))), 0.0);
    float hue = atan(f.y, f.x) / 6.2831853;
    vec3 tint = 0.62 + 0.38 * cos(6.2831853 * (hue + vec3(0.0, 0.33, 0.67)));
    v_color = mix(vec3(0.85, 0.9, 1.0), tint, 0.55) * light;
    gl_Position = u_vp * vec4(world, 1.0);
}
"#;

const COLOR_FS: &str = r#"#version 300 es
precision mediump float;
in vec3 v_color;
out vec4 o;
void main() { o = vec4(v_color, 1.0); }
"#;

const SHAPE_VS: &str = r#"#version 300 es
layout(location = 0) in vec3 a_pos;
uniform mat4 u_vp;
uniform vec3 u_offset;
uniform vec3 u_scale;
void main() { gl_Position = u_vp * vec4(u_offset + a_pos * u_scale, 1.0); }
"#;

const SHAPE_FS: &str = r#"#version 300 es
precision mediump float;
uniform vec4 u_color;
out vec4 o;
void main() { o = u_color; }
"#;

/// A full-screen triangle in the background colour, for trails.
const FADE_VS: &str = r#"#version 300 es
void main() {
    vec2 p = vec2(float((gl_VertexID << 1) & 2), float(gl_VertexID & 2));
    gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
}
"#;

const BACKGROUND: [f32; 3] = [0.035, 0.045, 0.075];
/// Alpha of the quad that fades the previous frame when trails are on.
const TRAIL_FADE: f32 = 0.25;
const CIRCLE_SEGMENTS: i32 = 48;

/// Where each shape lies in the shape buffer: (first vertex, count).
struct Shapes {
    cube_edges: (i32, i32),
    circles: [(i32, i32); 3],
    cross: (i32, i32),
    octahedron: (i32, i32),
}

/// What a frame shows besides the boids.
pub(crate) struct Scene<'a> {
    /// Projection × view.
    pub(crate) view_proj: Mat4,
    /// 0 shows the previous snapshot, 1 the newest.
    pub(crate) alpha: f32,
    /// Ticks from the previous snapshot to the newest (the unit of the
    /// per-boid spans of [`Renderer::upload_cells`]; 1 otherwise).
    pub(crate) interval_ticks: f32,
    /// Fade the previous frame instead of clearing it.
    pub(crate) trails: bool,
    /// World box size, metres.
    pub(crate) world: [f32; 3],
    /// 2 or 3.
    pub(crate) dims: u8,
    /// Predators, goals and obstacles.
    pub(crate) agents: Option<&'a AgentList>,
    /// Interest stream: the cells not held in full, as soft blobs at
    /// their centroids (centre, radius).
    pub(crate) blobs: &'a [(Vec3, f32)],
    /// The picked boid's position and its (separation, cohesion) radii.
    pub(crate) picked: Option<(Vec3, f32, f32)>,
    /// Flee radius around predators, metres.
    pub(crate) flee_radius_m: f32,
    /// Where a click would place something, and what.
    pub(crate) cursor: Option<(Vec3, Marker)>,
}

/// What the cursor marker previews.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Marker {
    /// A goal.
    Goal,
    /// A spherical obstacle of this radius, or boids spread this far.
    Sphere(f32),
    /// A pointer predator.
    Predator,
}

/// Colour of the ground grid.
const GROUND: [f32; 4] = [0.15, 0.19, 0.27, 1.0];
/// Most ground lines along the world's longer side.
const GROUND_LINES: f32 = 20.0;
/// Colour of the cursor marker and its drop line.
const CURSOR: [f32; 4] = [1.0, 0.85, 0.3, 1.0];

/// The ground grid's spacing for a world this wide: 1, 2 or 5 × 10^k
/// metres, the smallest giving at most [`GROUND_LINES`] lines.
pub(crate) fn ground_step(extent_m: f32) -> f32 {
    let raw = (extent_m / GROUND_LINES).max(1e-3);
    let decade = 10f32.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&s| s >= raw * 0.999)
        .unwrap_or(10.0 * decade)
}

/// The GL objects.
pub(crate) struct Renderer {
    gl: Gl,
    canvas: HtmlCanvasElement,
    boid_prog: WebGlProgram,
    shape_prog: WebGlProgram,
    fade_prog: WebGlProgram,
    boid_vao: WebGlVertexArrayObject,
    shape_vao: WebGlVertexArrayObject,
    pos: [WebGlBuffer; 2],
    head: [WebGlBuffer; 2],
    /// Per boid, the times of its two frames (interest stream only).
    spans: WebGlBuffer,
    /// Whether `spans` is in use (else every boid spans (−1, 0)).
    per_boid_spans: bool,
    /// Which of `pos`/`head` holds the newest frame.
    current: usize,
    n_boids: i32,
    boid_vertices: (i32, i32),
    quant: QuantBox,
    shapes: Shapes,
    u_boid: BoidUniforms,
    u_shape: ShapeUniforms,
    u_fade_color: Option<WebGlUniformLocation>,
}

struct BoidUniforms {
    vp: Option<WebGlUniformLocation>,
    origin: Option<WebGlUniformLocation>,
    extent: Option<WebGlUniformLocation>,
    time: Option<WebGlUniformLocation>,
    size: Option<WebGlUniformLocation>,
}

struct ShapeUniforms {
    vp: Option<WebGlUniformLocation>,
    offset: Option<WebGlUniformLocation>,
    scale: Option<WebGlUniformLocation>,
    color: Option<WebGlUniformLocation>,
}

impl Renderer {
    /// Sets up WebGL2 on `canvas`; the error says what is missing.
    pub(crate) fn new(canvas: HtmlCanvasElement, dims: u8) -> Result<Self, String> {
        let opts = js_sys::Object::new();
        for (k, v) in [("antialias", true), ("preserveDrawingBuffer", true)] {
            js_sys::Reflect::set(&opts, &k.into(), &v.into()).map_err(|_| "context options")?;
        }
        let gl: Gl = canvas
            .get_context_with_context_options("webgl2", &opts)
            .ok()
            .flatten()
            .and_then(|c| c.dyn_into().ok())
            .ok_or("this browser has no WebGL2: the viewer needs it")?;
        let boid_prog = program(&gl, BOID_VS, COLOR_FS)?;
        let shape_prog = program(&gl, SHAPE_VS, SHAPE_FS)?;
        let fade_prog = program(&gl, FADE_VS, SHAPE_FS)?;
        let buffer = || gl.create_buffer().ok_or("out of GL buffers");

        // The boid mesh: +x is forward.
        let mesh = if dims == 2 {
            triangle_mesh()
        } else {
            cone_mesh()
        };
        let boid_vao = gl.create_vertex_array().ok_or("no vertex arrays")?;
        gl.bind_vertex_array(Some(&boid_vao));
        let mesh_buf = buffer()?;
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&mesh_buf));
        gl.buffer_data_with_u8_array(
            Gl::ARRAY_BUFFER,
            bytemuck::cast_slice(&mesh),
            Gl::STATIC_DRAW,
        );
        gl.enable_vertex_attrib_array(0);
        gl.vertex_attrib_pointer_with_i32(0, 3, Gl::FLOAT, false, 24, 0);
        gl.enable_vertex_attrib_array(1);
        gl.vertex_attrib_pointer_with_i32(1, 3, Gl::FLOAT, false, 24, 12);
        let pos = [buffer()?, buffer()?];
        let head = [buffer()?, buffer()?];
        let spans = buffer()?;
        for loc in 2..7 {
            gl.enable_vertex_attrib_array(loc);
            gl.vertex_attrib_divisor(loc, 1);
        }
        // Until a frame with spans arrives, every boid spans (−1, 0).
        gl.disable_vertex_attrib_array(6);

        let (shape_data, shapes) = shape_mesh();
        let shape_vao = gl.create_vertex_array().ok_or("no vertex arrays")?;
        gl.bind_vertex_array(Some(&shape_vao));
        let shape_buf = buffer()?;
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&shape_buf));
        gl.buffer_data_with_u8_array(
            Gl::ARRAY_BUFFER,
            bytemuck::cast_slice(&shape_data),
            Gl::STATIC_DRAW,
        );
        gl.enable_vertex_attrib_array(0);
        gl.vertex_attrib_pointer_with_i32(0, 3, Gl::FLOAT, false, 12, 0);
        gl.bind_vertex_array(None);

        let u = |p: &WebGlProgram, name: &str| gl.get_uniform_location(p, name);
        let u_boid = BoidUniforms {
            vp: u(&boid_prog, "u_vp"),
            origin: u(&boid_prog, "u_origin"),
            extent: u(&boid_prog, "u_extent"),
            time: u(&boid_prog, "u_time"),
            size: u(&boid_prog, "u_size"),
        };
        let u_shape = ShapeUniforms {
            vp: u(&shape_prog, "u_vp"),
            offset: u(&shape_prog, "u_offset"),
            scale: u(&shape_prog, "u_scale"),
            color: u(&shape_prog, "u_color"),
        };
        let u_fade_color = u(&fade_prog, "u_color");
        Ok(Self {
            gl,
            canvas,
            boid_prog,
            shape_prog,
            fade_prog,
            boid_vao,
            shape_vao,
            pos,
            head,
            spans,
            per_boid_spans: false,
            current: 0,
            n_boids: 0,
            boid_vertices: (0, (mesh.len() / 6) as i32),
            quant: QuantBox::around_world([1.0; 3], 3),
            shapes,
            u_boid,
            u_shape,
            u_fade_color,
        })
    }

    /// Uploads the newest snapshot. When it lists other boids than the one
    /// before (`aligned` false) it is uploaded as both ends of the
    /// interpolation.
    pub(crate) fn upload(&mut self, newest: &Frame, aligned: bool) {
        self.use_spans(None);
        self.upload_newest(newest, aligned);
    }

    /// Uploads the interest stream's boids: each with its own two frames
    /// (`previous`, `newest`, the same boids in the same order) at its own
    /// times `spans` (ticks relative to the newest batch).
    pub(crate) fn upload_cells(&mut self, previous: &Frame, newest: &Frame, spans: &[[f32; 2]]) {
        self.use_spans(Some(spans));
        self.upload_newest(newest, true);
        let gl = &self.gl;
        let p = 1 - self.current;
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.pos[p]));
        gl.buffer_data_with_u8_array(
            Gl::ARRAY_BUFFER,
            bytemuck::cast_slice(&previous.pos),
            Gl::STREAM_DRAW,
        );
        gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.head[p]));
        gl.buffer_data_with_u8_array(Gl::ARRAY_BUFFER, &previous.heading, Gl::STREAM_DRAW);
    }

    /// Per-boid spans from `spans`, or none (every boid spans (−1, 0)).
    fn use_spans(&mut self, spans: Option<&[[f32; 2]]>) {
        let gl = &self.gl;
        gl.bind_vertex_array(Some(&self.boid_vao));
        match spans {
            Some(s) => {
                gl.bind_buffer(Gl::ARRAY_BUFFER, Some(&self.spans));
                gl.buffer_data_with_u8_array(
                    Gl::ARRAY_BUFFER,
                    bytemuck::cast_slice(s),
                    Gl::STREAM_DRAW,
                );
                gl.enable_vertex_attrib_array(6);
                gl.vertex_attrib_pointer_with_i32(6, 2, Gl::FLOAT, false, 0, 0);
            }
            None => gl.disable_vertex_attrib_array(6),
        }
        gl.bind_vertex_array(None);
        self.per_boid_spans = spans.is_some();
    }

    fn upload_newest(&mut self, newest: &Frame, aligned: bool) {
        let gl = &self.gl;
        self.current = 1 - self.current;
        let (c, p) = (self.current, 1 - self.current);
        let write = |buf: &WebGlBuffer, bytes: &[u8]| {
            gl.bind_buffer(Gl::ARRAY_BUFFER, Some(buf));
            gl.buffer_data_with_u8_array(Gl::ARRAY_BUFFER, bytes, Gl::STREAM_DRAW);
        };
        let pos: &[u8] = bytemuck::cast_slice(&newest.pos);
        write(&self.pos[c], pos);
        write(&self.head[c], &newest.heading);
        if !aligned || self.n_boids as usize != newest.len() {
            write(&self.pos[p], pos);
            write(&self.head[p], &newest.heading);
        }
        self.n_boids = newest.len() as i32;
        if let Some(q) = newest.quant {
            self.quant = q;
        }
        gl.bind_vertex_array(Some(&self.boid_vao));
        for (loc, buf, size, ty) in [
            (2, &self.pos[p], 3, Gl::UNSIGNED_SHORT),
            (3, &self.pos[c], 3, Gl::UNSIGNED_SHORT),
            (4, &self.head[p], 2, Gl::UNSIGNED_BYTE),
            (5, &self.head[c], 2, Gl::UNSIGNED_BYTE),
        ] {
            gl.bind_buffer(Gl::ARRAY_BUFFER, Some(buf));
            // Positions normalised to 0 ..= 1 of the box; heading bytes as is.
            gl.vertex_attrib_pointer_with_i32(loc, size, ty, ty == Gl::UNSIGNED_SHORT, 0, 0);
        }
        gl.bind_vertex_array(None);
    }

    /// Resizes the drawing buffer to the canvas's CSS size; returns the
    /// aspect ratio.
    pub(crate) fn fit(&self, device_pixel_ratio: f64) -> f32 {
        let w = (f64::from(self.canvas.client_width()) * device_pixel_ratio).round() as u32;
        let h = (f64::from(self.canvas.client_height()) * device_pixel_ratio).round() as u32;
        if w > 0 && h > 0 && (self.canvas.width() != w || self.canvas.height() != h) {
            self.canvas.set_width(w);
            self.canvas.set_height(h);
        }
        self.gl.viewport(
            0,
            0,
            self.canvas.width() as i32,
            self.canvas.height() as i32,
        );
        self.canvas.width() as f32 / self.canvas.height().max(1) as f32
    }

    /// Draws one frame.
    pub(crate) fn draw(&self, scene: &Scene<'_>) {
        let gl = &self.gl;
        let vp = scene.view_proj.to_cols_array();
        if scene.trails {
            gl.disable(Gl::DEPTH_TEST);
            gl.enable(Gl::BLEND);
            gl.blend_func(Gl::SRC_ALPHA, Gl::ONE_MINUS_SRC_ALPHA);
            gl.use_program(Some(&self.fade_prog));
            let [r, g, b] = BACKGROUND;
            gl.uniform4f(self.u_fade_color.as_ref(), r, g, b, TRAIL_FADE);
            gl.bind_vertex_array(None);
            gl.draw_arrays(Gl::TRIANGLES, 0, 3);
            gl.disable(Gl::BLEND);
            gl.clear(Gl::DEPTH_BUFFER_BIT);
        } else {
            let [r, g, b] = BACKGROUND;
            gl.clear_color(r, g, b, 1.0);
            gl.clear(Gl::COLOR_BUFFER_BIT | Gl::DEPTH_BUFFER_BIT);
        }
        gl.enable(Gl::DEPTH_TEST);

        if self.n_boids > 0 {
            let u = &self.u_boid;
            gl.use_program(Some(&self.boid_prog));
            gl.uniform_matrix4fv_with_f32_array(u.vp.as_ref(), false, &vp);
            gl.uniform3fv_with_f32_array(u.origin.as_ref(), &self.quant.origin_m);
            gl.uniform3fv_with_f32_array(u.extent.as_ref(), &self.quant.extent_m);
            // The time shown: from the previous snapshot (−1 interval) to the newest (0).
            let interval = if self.per_boid_spans {
                scene.interval_ticks.max(1.0)
            } else {
                1.0
            };
            gl.uniform1f(
                u.time.as_ref(),
                (scene.alpha.clamp(0.0, 1.0) - 1.0) * interval,
            );
            // Without per-boid spans, every boid spans (−1, 0).
            gl.vertex_attrib2f(6, -1.0, 0.0);
            let size = scene.world[0].max(scene.world[1]) / 180.0;
            gl.uniform1f(u.size.as_ref(), size);
            gl.bind_vertex_array(Some(&self.boid_vao));
            let (first, count) = self.boid_vertices;
            gl.draw_arrays_instanced(Gl::TRIANGLES, first, count, self.n_boids);
        }

        gl.use_program(Some(&self.shape_prog));
        gl.bind_vertex_array(Some(&self.shape_vao));
        gl.uniform_matrix4fv_with_f32_array(self.u_shape.vp.as_ref(), false, &vp);
        let w = Vec3::from(scene.world);
        self.ground(w);
        let world_box = if scene.dims == 2 { w.with_z(0.0) } else { w };
        self.shape(
            Gl::LINES,
            self.shapes.cube_edges,
            world_box * 0.5,
            world_box,
            [0.45, 0.5, 0.6, 1.0],
        );
        if let Some(agents) = scene.agents {
            self.agents(agents, scene);
        }
        if !scene.blobs.is_empty() {
            // Translucent, unlit, and not hiding what is behind them.
            gl.enable(Gl::BLEND);
            gl.blend_func(Gl::SRC_ALPHA, Gl::ONE_MINUS_SRC_ALPHA);
            gl.depth_mask(false);
            for &(at, radius) in scene.blobs {
                let scale = if scene.dims == 2 {
                    Vec3::new(radius, radius, 0.01)
                } else {
                    Vec3::splat(radius)
                };
                self.shape(
                    Gl::TRIANGLES,
                    self.shapes.octahedron,
                    at,
                    scale,
                    [0.55, 0.7, 1.0, 0.18],
                );
            }
            gl.depth_mask(true);
            gl.disable(Gl::BLEND);
        }
        if let Some((p, sep, coh)) = scene.picked {
            self.sphere(p, sep, [1.0, 0.45, 0.3, 1.0], scene.dims);
            self.sphere(p, coh, [0.4, 0.9, 1.0, 1.0], scene.dims);
        }
        if let Some((at, marker)) = scene.cursor {
            self.cursor(at, marker, scene);
        }
        gl.bind_vertex_array(None);
    }

    /// Lines on the floor (z = 0) every [`ground_step`] metres.
    fn ground(&self, w: Vec3) {
        let step = ground_step(w.x.max(w.y));
        let (first, _) = self.shapes.cross;
        // The cross's first two vertices run along x, the next two along y.
        let (along_x, along_y) = ((first, 2), (first + 2, 2));
        let lines = |extent: f32| (0..=(extent / step) as u32).map(move |k| k as f32 * step);
        for x in lines(w.x) {
            let at = Vec3::new(x, w.y * 0.5, 0.0);
            self.shape(
                Gl::LINES,
                along_y,
                at,
                Vec3::new(1.0, w.y * 0.5, 1.0),
                GROUND,
            );
        }
        for y in lines(w.y) {
            let at = Vec3::new(w.x * 0.5, y, 0.0);
            self.shape(
                Gl::LINES,
                along_x,
                at,
                Vec3::new(w.x * 0.5, 1.0, 1.0),
                GROUND,
            );
        }
    }

    /// What a click would place, where, with a line down to the floor (3-D).
    fn cursor(&self, at: Vec3, marker: Marker, scene: &Scene<'_>) {
        let size = scene.world[0].max(scene.world[1]) / 60.0;
        match marker {
            Marker::Goal => {
                self.shape(Gl::LINES, self.shapes.cross, at, Vec3::splat(size), CURSOR);
            }
            Marker::Sphere(r) => self.sphere(at, r, CURSOR, scene.dims),
            Marker::Predator => self.shape(
                Gl::LINES,
                self.shapes.cross,
                at,
                Vec3::splat(size * 1.5),
                [1.0, 0.3, 0.2, 1.0],
            ),
        }
        if scene.dims == 3 && at.z > 0.0 {
            let (first, _) = self.shapes.cross;
            // The cross's z segment, from the point to the floor.
            let drop = (first + 4, 2);
            let half = at.z * 0.5;
            self.shape(
                Gl::LINES,
                drop,
                at.with_z(half),
                Vec3::new(1.0, 1.0, half),
                CURSOR,
            );
            self.shape(
                Gl::LINE_LOOP,
                self.shapes.circles[0],
                at.with_z(0.0),
                Vec3::splat(size * 0.5),
                CURSOR,
            );
        }
    }

    fn agents(&self, agents: &AgentList, scene: &Scene<'_>) {
        let size = scene.world[0].max(scene.world[1]) / 60.0;
        for o in &agents.obstacles {
            let color = [0.75, 0.75, 0.8, 1.0];
            match o.shape {
                Shape::Sphere { center, radius_m } => {
                    self.sphere(Vec3::from(center), radius_m, color, scene.dims);
                }
                Shape::Box { min, max } => {
                    let (min, max) = (Vec3::from(min), Vec3::from(max));
                    self.shape(
                        Gl::LINES,
                        self.shapes.cube_edges,
                        (min + max) * 0.5,
                        max - min,
                        color,
                    );
                }
            }
        }
        for g in &agents.goals {
            let green = [0.35, 1.0, 0.45, 1.0];
            self.shape(
                Gl::LINES,
                self.shapes.cross,
                Vec3::from(g.target),
                Vec3::splat(size),
                green,
            );
            self.sphere(Vec3::from(g.target), g.arrive_radius_m, green, scene.dims);
            for w in &g.waypoints {
                let dim = [0.3, 0.7, 0.4, 1.0];
                self.shape(
                    Gl::LINES,
                    self.shapes.cross,
                    Vec3::from(*w),
                    Vec3::splat(size * 0.6),
                    dim,
                );
            }
        }
        for p in &agents.predators {
            let at = Vec3::from(p.position);
            self.shape(
                Gl::TRIANGLES,
                self.shapes.octahedron,
                at,
                Vec3::splat(size),
                [1.0, 0.2, 0.15, 1.0],
            );
            self.sphere(at, scene.flee_radius_m, [0.8, 0.2, 0.15, 1.0], scene.dims);
        }
    }

    /// A wire sphere: three great circles (one in 2-D).
    fn sphere(&self, at: Vec3, radius: f32, color: [f32; 4], dims: u8) {
        let circles = if dims == 2 { 1 } else { 3 };
        for &c in &self.shapes.circles[..circles] {
            self.shape(Gl::LINE_LOOP, c, at, Vec3::splat(radius), color);
        }
    }

    fn shape(
        &self,
        mode: u32,
        (first, count): (i32, i32),
        offset: Vec3,
        scale: Vec3,
        color: [f32; 4],
    ) {
        let gl = &self.gl;
        let u = &self.u_shape;
        gl.uniform3f(u.offset.as_ref(), offset.x, offset.y, offset.z);
        gl.uniform3f(u.scale.as_ref(), scale.x, scale.y, scale.z);
        // Four floats, not an array: no JS typed array per call.
        let [r, g, b, a] = color;
        gl.uniform4f(u.color.as_ref(), r, g, b, a);
        gl.draw_arrays(mode, first, count);
    }
}

fn program(gl: &Gl, vs: &str, fs: &str) -> Result<WebGlProgram, String> {
    let vs = shader(gl, Gl::VERTEX_SHADER, vs)?;
    let fs = shader(gl, Gl::FRAGMENT_SHADER, fs)?;
    let p = gl.create_program().ok_or("cannot create a GL program")?;
    gl.attach_shader(&p, &vs);
    gl.attach_shader(&p, &fs);
    gl.link_program(&p);
    if gl.get_program_parameter(&p, Gl::LINK_STATUS).as_bool() == Some(true) {
        Ok(p)
    } else {
        Err(format!(
            "GL program: {}",
            gl.get_program_info_log(&p).unwrap_or_default()
        ))
    }
}

fn shader(gl: &Gl, kind: u32, src: &str) -> Result<WebGlShader, String> {
    let s = gl.create_shader(kind).ok_or("cannot create a GL shader")?;
    gl.shader_source(&s, src);
    gl.compile_shader(&s);
    if gl.get_shader_parameter(&s, Gl::COMPILE_STATUS).as_bool() == Some(true) {
        Ok(s)
    } else {
        Err(format!(
            "GL shader: {}",
            gl.get_shader_info_log(&s).unwrap_or_default()
        ))
    }
}

/// A cone along +x (tip at x = 1.2, base at x = -0.6), position and
/// normal per vertex, 6 sides.
pub(crate) fn cone_mesh() -> Vec<f32> {
    const SIDES: usize = 6;
    let mut v = Vec::with_capacity(SIDES * 6 * 6);
    let (tip, base_x, r) = (1.2f32, -0.6f32, 0.4f32);
    let ring = |k: usize| {
        let a = k as f32 / SIDES as f32 * std::f32::consts::TAU;
        (a.cos() * r, a.sin() * r)
    };
    for k in 0..SIDES {
        let (y0, z0) = ring(k);
        let (y1, z1) = ring(k + 1);
        let mid = (k as f32 + 0.5) / SIDES as f32 * std::f32::consts::TAU;
        let n = glam::Vec3::new(r, mid.cos() * (tip - base_x), mid.sin() * (tip - base_x))
            .normalize()
            .to_array();
        for p in [[tip, 0.0, 0.0], [base_x, y0, z0], [base_x, y1, z1]] {
            v.extend_from_slice(&p);
            v.extend_from_slice(&n);
        }
        // The base cap.
        for p in [[base_x, 0.0, 0.0], [base_x, y1, z1], [base_x, y0, z0]] {
            v.extend_from_slice(&p);
            v.extend_from_slice(&[-1.0, 0.0, 0.0]);
        }
    }
    v
}

/// A flat arrowhead triangle along +x in the xy plane, facing up.
pub(crate) fn triangle_mesh() -> Vec<f32> {
    let mut v = Vec::with_capacity(18);
    for p in [[1.4f32, 0.0, 0.0], [-0.7, 0.55, 0.0], [-0.7, -0.55, 0.0]] {
        v.extend_from_slice(&p);
        v.extend_from_slice(&[0.0, 0.0, 1.0]);
    }
    v
}

/// The line and triangle shapes, unit sized and centred on the origin.
fn shape_mesh() -> (Vec<f32>, Shapes) {
    let mut v: Vec<f32> = Vec::new();
    let mark = |v: &mut Vec<f32>, start: usize| (start as i32 / 3, (v.len() - start) as i32 / 3);
    let start = v.len();
    for (a, b) in [
        (0b000, 0b001),
        (0b010, 0b011),
        (0b100, 0b101),
        (0b110, 0b111),
        (0b000, 0b010),
        (0b001, 0b011),
        (0b100, 0b110),
        (0b101, 0b111),
        (0b000, 0b100),
        (0b001, 0b101),
        (0b010, 0b110),
        (0b011, 0b111),
    ] {
        for c in [a, b] {
            v.extend_from_slice(&[
                if c & 1 != 0 { 0.5 } else { -0.5 },
                if c & 2 != 0 { 0.5 } else { -0.5 },
                if c & 4 != 0 { 0.5 } else { -0.5 },
            ]);
        }
    }
    let cube_edges = mark(&mut v, start);
    let mut circles = [(0, 0); 3];
    for (plane, slot) in circles.iter_mut().enumerate() {
        let start = v.len();
        for k in 0..CIRCLE_SEGMENTS {
            let (s, c) = (k as f32 / CIRCLE_SEGMENTS as f32 * std::f32::consts::TAU).sin_cos();
            v.extend_from_slice(&match plane {
                0 => [c, s, 0.0],
                1 => [c, 0.0, s],
                _ => [0.0, c, s],
            });
        }
        *slot = mark(&mut v, start);
    }
    let start = v.len();
    for p in [
        [-1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0],
        [0.0, -1.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, -1.0],
        [0.0, 0.0, 1.0],
    ] {
        v.extend_from_slice(&p);
    }
    let cross = mark(&mut v, start);
    let start = v.len();
    for sx in [-1.0f32, 1.0] {
        for sy in [-1.0f32, 1.0] {
            for sz in [-1.0f32, 1.0] {
                v.extend_from_slice(&[sx, 0.0, 0.0, 0.0, sy, 0.0, 0.0, 0.0, sz]);
            }
        }
    }
    let octahedron = mark(&mut v, start);
    (
        v,
        Shapes {
            cube_edges,
            circles,
            cross,
            octahedron,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ground_grid_has_round_spacing_and_at_most_twenty_lines() {
        assert_eq!(ground_step(160.0), 10.0);
        assert_eq!(ground_step(1000.0), 50.0);
        assert_eq!(ground_step(100_000.0), 5000.0);
        assert_eq!(ground_step(20.0), 1.0);
        assert_eq!(ground_step(3.0), 0.2);
        for extent in [1.0, 7.0, 33.0, 160.0, 999.0, 12_345.0] {
            let lines = extent / ground_step(extent);
            assert!(
                lines <= GROUND_LINES + 1e-3 && lines > GROUND_LINES / 5.0,
                "{extent}: {lines}"
            );
        }
    }

    #[test]
    fn meshes_are_whole_triangles_with_unit_scale() {
        for mesh in [cone_mesh(), triangle_mesh()] {
            assert_eq!(mesh.len() % 18, 0, "3 vertices × (position, normal)");
            assert!(mesh.iter().all(|x| x.is_finite() && x.abs() <= 1.5));
        }
        let (data, s) = shape_mesh();
        assert_eq!(data.len() % 3, 0);
        assert_eq!(s.cube_edges.1, 24);
        assert_eq!(s.circles.map(|c| c.1), [CIRCLE_SEGMENTS; 3]);
        assert_eq!(s.octahedron.1, 24);
        let end = s.octahedron.0 + s.octahedron.1;
        assert_eq!(end as usize, data.len() / 3, "shapes tile the buffer");
    }
}
