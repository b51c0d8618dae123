/* Draws one heatmap with the page's own svg.js and heatmap.js under a minimal DOM, hovers
 * cells and prints what the tooltip says (tests/app/test_measure_flags_surface.py).
 *
 * node heatmap_tooltip.js STATIC_DIR < {"matrix": {...}, "hover": [[i, j], ...]}
 * prints {"tooltips": [[line, ...], ...], "flagged": N, "marks": N}: per hovered cell the
 * tooltip's rows, then how many cells carry the class "flagged" and how many hatch marks
 * ("flag-mark") lie over them. */
"use strict";

const fs = require("fs");
const path = require("path");
const vm = require("vm");

class Node {
  constructor(tag) {
    this.tagName = tag;
    this.children = [];
    this.attrs = {};
    this.listeners = {};
    this.style = {};
    this.textContent = "";
    this.hidden = false;
    this.offsetWidth = 200;
    this.offsetHeight = 80;
    this.clientWidth = 600;
  }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  getAttribute(k) { return k in this.attrs ? this.attrs[k] : null; }
  get className() { return this.attrs.class || ""; }
  set className(v) { this.attrs.class = v; }
  get classList() {
    const node = this;
    const names = function () { return node.className.split(/\s+/).filter(Boolean); };
    return {
      contains: function (c) { return names().includes(c); },
      add: function (c) { node.className = names().concat([c]).join(" "); },
      remove: function (c) { node.className = names().filter(function (n) { return n !== c; }).join(" "); },
      toggle: function () {},
    };
  }
  appendChild(c) { this.children.push(c); return c; }
  append(...cs) { cs.forEach((c) => this.children.push(typeof c === "string" ? { text: c } : c)); }
  replaceChildren(...cs) { this.children = []; this.append(...cs); }
  addEventListener(type, f) { this.listeners[type] = f; }
  querySelectorAll() { return []; }
  querySelector() { return null; }
  text() {
    if (this.children.length === 0) return this.textContent;
    return this.children.map((c) => (c instanceof Node ? c.text() : c.text)).join("");
  }
  all() { return [this].concat(...this.children.filter((c) => c instanceof Node).map((c) => c.all())); }
}
class SVGRectElement extends Node {}

const body = new Node("body");
const context = {
  SVGRectElement: SVGRectElement,
  document: {
    body: body,
    createElement: (tag) => new Node(tag),
    createElementNS: (ns, tag) => (tag === "rect" ? new SVGRectElement(tag) : new Node(tag)),
  },
  Math: Math,
  Number: Number,
  String: String,
  Object: Object,
  parseInt: parseInt,
};
context.window = Object.assign(context, { innerWidth: 1280, innerHeight: 900 });
vm.createContext(context);
for (const name of ["svg.js", "heatmap.js"]) {
  vm.runInContext(fs.readFileSync(path.join(process.argv[2], name), "utf8"), context);
}

const given = JSON.parse(fs.readFileSync(0, "utf8"));
const host = new Node("div");
const svg = context.window.CkaHeatmap.draw(host, given.matrix, {});
const cells = svg.children.find((c) => c.className === "cells");
const rects = cells.all();
const tooltips = given.hover.map(function (ij) {
  const target = rects.find((r) => r.className.split(" ").includes("cell") &&
    r.getAttribute("data-i") === String(ij[0]) && r.getAttribute("data-j") === String(ij[1]));
  cells.listeners.mouseleave();
  cells.listeners.mouseover({ target: target, clientX: 10, clientY: 10 });
  const tip = body.children[0];
  return tip.children.map((row) => row.text());
});
process.stdout.write(JSON.stringify({
  tooltips: tooltips,
  flagged: rects.filter((r) => r.classList.contains("flagged")).length,
  marks: rects.filter((r) => r.className === "flag-mark").length,
}));
