/**
 * DynamoDB's measures of what a request carries, as its limits count them (shared/runtime/dynamoLimits.ts
 * enforces the limits): the size of an attribute value and of an item, and the operators and functions
 * of an expression. Calibrated against DynamoDB Local 3.3.1 (AWS's own engine; the figures in the comments
 * are its answers), where AWS's documentation says "approximately":
 * https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/Constraints.html
 */
import type { AttributeValue } from '@aws-sdk/client-dynamodb';

// ---------------------------------------------------------------------------------------------------
// Sizes

/** A string's size: its UTF-8 bytes. */
export const utf8 = (s: string): number => Buffer.byteLength(s, 'utf8');

function bytesOf(b: unknown): number {
  if (typeof b === 'string') return utf8(b);
  if (b instanceof Uint8Array) return b.byteLength;
  if (ArrayBuffer.isView(b)) return b.byteLength;
  if (b instanceof ArrayBuffer) return b.byteLength;
  return 0;
}

/**
 * The size of a number as DynamoDB stores it: a byte of exponent, then the significant digits in base
 * 100, two decimal digits a byte, aligned on the decimal point, without the leading and trailing zero
 * bytes; a negative number one byte more; zero one byte. ("approximately 1 byte per two significant
 * digits, plus 1 byte" in AWS's words; calibrated on DynamoDB Local: 1 and 12 take 2 bytes, 123 and 1.5
 * take 3, 100 and 0.05 take 2, -1 takes 3, 38 digits take 20.)
 */
export function numberSize(n: string): number {
  let s = n.trim();
  const negative = s.startsWith('-');
  if (negative || s.startsWith('+')) s = s.slice(1);
  let exponent = 0;
  const e = s.search(/[eE]/);
  if (e >= 0) {
    exponent = Number(s.slice(e + 1));
    s = s.slice(0, e);
  }
  const dot = s.indexOf('.');
  let digits = dot >= 0 ? s.slice(0, dot) + s.slice(dot + 1) : s;
  /** How many of `digits` are before the decimal point (negative: zeros after it first). */
  let point = (dot >= 0 ? dot : s.length) + exponent;
  const leading = digits.length - digits.replace(/^0+/, '').length;
  digits = digits.slice(leading).replace(/0+$/, '');
  point -= leading;
  if (digits === '') return 1;
  // Base-100 digits pair the decimal digits from the point: an odd number before it starts with a half.
  if (Math.abs(point % 2) === 1) digits = `0${digits}`;
  return 1 + Math.ceil(digits.length / 2) + (negative ? 1 : 0);
}

/**
 * The size of an attribute value (DynamoDB's item size rules, Constraints page and calibration): a string
 * its UTF-8 bytes, binary its bytes, a number as numberSize, a boolean or null 1, a set the sum of its
 * elements; a list or map 3 bytes, plus per element its size and 1 byte (and in a map its name's bytes).
 */
export function attributeValueSize(value: AttributeValue): number {
  const v = value as unknown as Record<string, unknown>;
  if (typeof v.S === 'string') return utf8(v.S);
  if (typeof v.N === 'string') return numberSize(v.N);
  if (v.B !== undefined) return bytesOf(v.B);
  if (v.BOOL !== undefined || v.NULL !== undefined) return 1;
  if (Array.isArray(v.SS)) return v.SS.reduce((sum: number, s: string) => sum + utf8(s), 0);
  if (Array.isArray(v.NS)) return v.NS.reduce((sum: number, s: string) => sum + numberSize(s), 0);
  if (Array.isArray(v.BS)) return v.BS.reduce((sum: number, b: unknown) => sum + bytesOf(b), 0);
  if (Array.isArray(v.L)) {
    return 3 + (v.L as AttributeValue[]).reduce((sum, e) => sum + attributeValueSize(e) + 1, 0);
  }
  if (v.M && typeof v.M === 'object') {
    return (
      3 +
      Object.entries(v.M as Record<string, AttributeValue>).reduce(
        (sum, [name, e]) => sum + utf8(name) + attributeValueSize(e) + 1,
        0,
      )
    );
  }
  return 0;
}

/** An item's size: each attribute's name (UTF-8 bytes) and value. A key is sized the same way. */
export function itemSize(item: Record<string, AttributeValue>): number {
  let size = 0;
  for (const [name, value] of Object.entries(item)) {
    if (value !== undefined) size += utf8(name) + attributeValueSize(value);
  }
  return size;
}

// ---------------------------------------------------------------------------------------------------
// Expressions

export type ExpressionKind = 'condition' | 'update' | 'projection';

/** What countOperators finds in an expression. */
export interface ExpressionCounts {
  /** Operators and functions, as DynamoDB counts them against its limit of 300. */
  readonly operators: number;
  /** The operand count of each IN, in the order they end. */
  readonly inOperands: readonly number[];
}

/**
 * Counts an expression's operators and functions as DynamoDB does (calibrated on DynamoDB Local, each
 * counting 1): in a condition (Condition, Filter, KeyCondition) each comparator = <> < <= > >=, AND, OR,
 * NOT, BETWEEN (its AND is part of it), IN (whatever its operands), and each function call
 * (attribute_exists, attribute_not_exists, attribute_type, begins_with, contains, size); in an update
 * each + and - and each function call (if_not_exists, list_append); the = of a SET, SET, REMOVE, ADD,
 * DELETE, parentheses, commas, names (#x), values (:x) and document paths (a.b[1]) count nothing. A
 * projection has none. The tokenizer does not check syntax: DynamoDB refuses a malformed expression anyway.
 */
export function countOperators(expression: string, kind: ExpressionKind): ExpressionCounts {
  let operators = 0;
  const inOperands: number[] = [];
  let depth = 0;
  /** Depths of the BETWEENs whose AND is still to come. */
  const betweens: number[] = [];
  /** An IN was read: the next '(' opens its operands. */
  let inPending = false;
  /** The open operand lists of INs: the depth inside each, and its operands so far. */
  const ins: Array<{ depth: number; operands: number }> = [];
  let i = 0;
  const n = expression.length;
  const word = /[A-Za-z0-9_]/;
  while (i < n) {
    const c = expression[i] as string;
    if (/\s/.test(c)) {
      i++;
    } else if (c === '#' || c === ':') {
      // A name or value placeholder.
      i++;
      while (i < n && word.test(expression[i] as string)) i++;
    } else if (/[A-Za-z_]/.test(c)) {
      let j = i;
      while (j < n && word.test(expression[j] as string)) j++;
      const token = expression.slice(i, j).toUpperCase();
      i = j;
      if (kind === 'condition' && token === 'AND' && betweens.at(-1) === depth) {
        betweens.pop(); // BETWEEN's own AND
      } else if (kind === 'condition' && (token === 'AND' || token === 'OR' || token === 'NOT')) {
        operators++;
      } else if (kind === 'condition' && token === 'BETWEEN') {
        operators++;
        betweens.push(depth);
      } else if (kind === 'condition' && token === 'IN') {
        operators++;
        inPending = true;
      } else if (kind !== 'projection') {
        // A function when a '(' follows; otherwise a path element or an update's clause keyword.
        let k = i;
        while (k < n && /\s/.test(expression[k] as string)) k++;
        if (expression[k] === '(') operators++;
      }
    } else if (c === '(') {
      depth++;
      if (inPending) ins.push({ depth, operands: 1 });
      inPending = false;
      i++;
    } else if (c === ')') {
      const list = ins.at(-1);
      if (list?.depth === depth) {
        ins.pop();
        inOperands.push(list.operands);
      }
      depth--;
      i++;
    } else if (c === ',') {
      const list = ins.at(-1);
      if (list?.depth === depth) list.operands++;
      i++;
    } else if (c === '<' || c === '>' || c === '=') {
      // A comparator (= <> < <= > >=), or the = of an update's SET, which counts nothing.
      if (kind === 'condition') operators++;
      const next = expression[i + 1];
      i += next === '=' || (c === '<' && next === '>') ? 2 : 1;
    } else if (kind === 'update' && (c === '+' || c === '-')) {
      operators++;
      i++;
    } else {
      i++; // '.', '[', ']', the digits of an index
    }
  }
  return { operators, inOperands };
}
