// A form for an answer, made from the question's JSON Schema, and the
// checks the answer must pass before it is sent: types, required fields,
// enum and const, minimum and maximum, string length and pattern, array
// length and items. The server checks the answer again.

import { h } from './dom.js';

let ids = 0;

/** The schema's types as a list (`type` may be a string or a list). */
function types(schema) {
  if (!schema || schema.type === undefined) return [];
  return Array.isArray(schema.type) ? schema.type : [schema.type];
}

/** What `value` is in JSON Schema's terms. */
function typeOf(value) {
  if (value === null) return 'null';
  if (Array.isArray(value)) return 'array';
  if (typeof value === 'number') return Number.isInteger(value) ? 'integer' : 'number';
  return typeof value;
}

function typeMatches(t, value) {
  const v = typeOf(value);
  return t === v || (t === 'number' && v === 'integer');
}

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * The ways `value` breaks `schema`, each `{path, message}` (`path` as
 * `/field/0`); empty when it fits.
 */
export function validate(schema, value, path = '') {
  const errors = [];
  if (schema === true || schema === undefined || schema === null) return errors;
  if (schema === false) return [{ path, message: 'no value is allowed here' }];
  const ts = types(schema);
  if (ts.length && !ts.some((t) => typeMatches(t, value))) {
    errors.push({ path, message: `must be ${ts.map(article).join(' or ')}` });
    return errors;
  }
  if (schema.enum && !schema.enum.some((e) => same(e, value))) {
    errors.push({ path, message: `must be one of ${schema.enum.map((e) => JSON.stringify(e)).join(', ')}` });
  }
  if (schema.const !== undefined && !same(schema.const, value)) {
    errors.push({ path, message: `must be ${JSON.stringify(schema.const)}` });
  }
  if (typeof value === 'number') {
    if (schema.minimum !== undefined && value < schema.minimum) errors.push({ path, message: `must be at least ${schema.minimum}` });
    if (schema.maximum !== undefined && value > schema.maximum) errors.push({ path, message: `must be at most ${schema.maximum}` });
    if (typeof schema.exclusiveMinimum === 'number' && value <= schema.exclusiveMinimum) errors.push({ path, message: `must be more than ${schema.exclusiveMinimum}` });
    if (typeof schema.exclusiveMaximum === 'number' && value >= schema.exclusiveMaximum) errors.push({ path, message: `must be less than ${schema.exclusiveMaximum}` });
    if (schema.multipleOf && Math.abs(value / schema.multipleOf - Math.round(value / schema.multipleOf)) > 1e-9) {
      errors.push({ path, message: `must be a multiple of ${schema.multipleOf}` });
    }
  }
  if (typeof value === 'string') {
    // JSON Schema counts characters (code points), not UTF-16 units.
    const len = [...value].length;
    if (schema.minLength !== undefined && len < schema.minLength) errors.push({ path, message: `must have at least ${schema.minLength} characters` });
    if (schema.maxLength !== undefined && len > schema.maxLength) errors.push({ path, message: `must have at most ${schema.maxLength} characters` });
    if (schema.pattern !== undefined) {
      let re = null;
      try {
        re = new RegExp(schema.pattern, 'u');
      } catch {
        re = null;
      }
      if (re && !re.test(value)) errors.push({ path, message: `must match the pattern ${schema.pattern}` });
    }
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) errors.push({ path, message: `must have at least ${schema.minItems} items` });
    if (schema.maxItems !== undefined && value.length > schema.maxItems) errors.push({ path, message: `must have at most ${schema.maxItems} items` });
    if (schema.uniqueItems && new Set(value.map((v) => JSON.stringify(v))).size !== value.length) {
      errors.push({ path, message: 'must not repeat an item' });
    }
    if (schema.items && typeof schema.items === 'object' && !Array.isArray(schema.items)) {
      value.forEach((v, i) => errors.push(...validate(schema.items, v, `${path}/${i}`)));
    }
  }
  if (typeOf(value) === 'object') {
    for (const k of schema.required || []) {
      if (!(k in value)) errors.push({ path: `${path}/${k}`, message: 'is required' });
    }
    const props = schema.properties || {};
    for (const [k, v] of Object.entries(value)) {
      if (props[k] !== undefined) errors.push(...validate(props[k], v, `${path}/${k}`));
      else if (schema.additionalProperties === false) errors.push({ path: `${path}/${k}`, message: 'is not a field of this answer' });
      else if (typeof schema.additionalProperties === 'object') errors.push(...validate(schema.additionalProperties, v, `${path}/${k}`));
    }
  }
  return errors;
}

function article(t) {
  return { object: 'an object', array: 'a list', integer: 'a whole number', number: 'a number', string: 'text', boolean: 'true or false', null: 'null' }[t] || t;
}

/**
 * A form's fields for `schema`: `{el, read}`, where `read()` gives
 * `{value}` or `{error}` (a field that cannot even be read, such as
 * malformed JSON), and `show(errors)` marks the fields that are wrong.
 */
export function schemaFields(schema, label) {
  const fields = new Map();
  const field = build(schema || {}, label, '', true, fields);
  return {
    el: field.el,
    read: field.read,
    show(errors) {
      for (const f of fields.values()) f.mark(null);
      const rest = [];
      for (const e of errors) {
        const f = fields.get(e.path) || fields.get(parentPath(e.path));
        if (f) f.mark(e.message);
        else rest.push(e);
      }
      return rest;
    },
  };
}

function parentPath(p) {
  return p.slice(0, Math.max(0, p.lastIndexOf('/')));
}

/** One field (or fieldset) for `schema` at `path`. */
function build(schema, label, path, required, fields) {
  const ts = types(schema);
  const id = `f${++ids}`;
  const hintId = `${id}-hint`;
  const errId = `${id}-err`;
  const hint = hintText(schema, required);
  const err = h('p', { class: 'field-error', id: errId, hidden: true });
  const describedBy = `${hint ? hintId : ''} ${errId}`.trim();
  const labelEl = h('label', { htmlFor: id }, label, required ? h('span', { class: 'req' }, ' (required)') : null);
  const hintEl = hint ? h('p', { class: 'hint', id: hintId }, hint) : null;
  const wrap = (control, extraClass = '') => {
    control.setAttribute('aria-describedby', describedBy);
    const el = h('div', { class: `field ${extraClass}` }, labelEl, hintEl, control, err);
    return el;
  };
  const mark = (control) => (message) => {
    err.hidden = !message;
    err.textContent = message ? `${label} ${message}` : '';
    if (message) control.setAttribute('aria-invalid', 'true');
    else control.removeAttribute('aria-invalid');
  };

  if (ts.includes('object') && schema.properties) {
    const subs = Object.entries(schema.properties).map(([k, s]) => [k, build(s || {}, s && s.title ? s.title : k, `${path}/${k}`, (schema.required || []).includes(k), fields)]);
    const el = h('fieldset', { class: 'fieldset' }, h('legend', null, label), hintEl, subs.map(([, f]) => f.el), err);
    const legendMark = (message) => {
      err.hidden = !message;
      err.textContent = message || '';
    };
    fields.set(path, { mark: legendMark });
    return {
      el,
      read() {
        const out = {};
        for (const [k, f] of subs) {
          const r = f.read();
          if (r.error) return r;
          if (r.value !== undefined) out[k] = r.value;
        }
        return { value: out };
      },
    };
  }

  if (schema.enum && schema.enum.every((e) => typeof e !== 'object' || e === null)) {
    const select = h('select', { id, required },
      h('option', { value: '' }, 'Choose…'),
      schema.enum.map((e, i) => h('option', { value: String(i) }, String(e))));
    fields.set(path, { mark: mark(select) });
    return {
      el: wrap(select),
      read: () => ({ value: select.value === '' ? undefined : schema.enum[Number(select.value)] }),
    };
  }

  if (ts.length === 1 && ts[0] === 'boolean') {
    const box = h('input', { id, type: 'checkbox' });
    fields.set(path, { mark: mark(box) });
    return { el: wrap(box, 'check'), read: () => ({ value: box.checked }) };
  }

  if (ts.length === 1 && (ts[0] === 'integer' || ts[0] === 'number')) {
    // Not `type=number`: the browser would refuse out-of-range values
    // itself, silently; the page's own checks say why.
    const input = h('input', { id, type: 'text', inputmode: ts[0] === 'integer' ? 'numeric' : 'decimal', autocomplete: 'off' });
    fields.set(path, { mark: mark(input) });
    return {
      el: wrap(input),
      read() {
        const s = input.value.trim();
        if (s === '') return { value: undefined };
        const n = Number(s);
        if (!Number.isFinite(n)) return { error: { path, message: 'must be a number' } };
        return { value: n };
      },
    };
  }

  if (ts.length === 1 && ts[0] === 'string') {
    const long = schema.maxLength === undefined || schema.maxLength > 200;
    const input = long
      ? h('textarea', { id, rows: '3' })
      : h('input', { id, type: 'text', autocomplete: 'off' });
    fields.set(path, { mark: mark(input) });
    return {
      el: wrap(input),
      read: () => ({ value: input.value === '' && !required ? undefined : input.value }),
    };
  }

  if (!schema || ts.length === 0 && Object.keys(schema).length === 0 && path === '') {
    // No schema: the answer is text.
    const input = h('textarea', { id, rows: '3' });
    fields.set(path, { mark: mark(input) });
    return { el: wrap(input), read: () => ({ value: input.value }) };
  }

  // Anything else (lists, unions, nested shapes): JSON, checked like the rest.
  const area = h('textarea', { id, rows: '4', class: 'json', spellcheck: 'false' });
  fields.set(path, { mark: mark(area) });
  return {
    el: wrap(area),
    read() {
      const s = area.value.trim();
      if (s === '') return { value: undefined };
      try {
        return { value: JSON.parse(s) };
      } catch {
        return { error: { path, message: 'is not valid JSON' } };
      }
    },
  };
}

/** What a field expects, in words. */
function hintText(schema, required) {
  const parts = [];
  if (schema.description) parts.push(schema.description);
  const ts = types(schema);
  if (ts.includes('integer')) parts.push('A whole number');
  else if (ts.includes('number')) parts.push('A number');
  if (schema.minimum !== undefined && schema.maximum !== undefined) parts.push(`from ${schema.minimum} to ${schema.maximum}`);
  else if (schema.minimum !== undefined) parts.push(`at least ${schema.minimum}`);
  else if (schema.maximum !== undefined) parts.push(`at most ${schema.maximum}`);
  if (schema.minLength !== undefined && schema.maxLength !== undefined) parts.push(`${schema.minLength} to ${schema.maxLength} characters`);
  else if (schema.minLength !== undefined) parts.push(`at least ${schema.minLength} characters`);
  else if (schema.maxLength !== undefined) parts.push(`at most ${schema.maxLength} characters`);
  if (!ts.length && !schema.enum && Object.keys(schema).length) parts.push('JSON');
  if (ts.includes('array') || (ts.includes('object') && !schema.properties)) parts.push('as JSON');
  if (!required && parts.length) parts.push('(optional)');
  return parts.join(' ');
}
