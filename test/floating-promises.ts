/**
 * The floating-promise checker behind test/no-floating-promises.test.ts, on the `typescript`
 * compiler API (no linter). A promise that nobody awaits loses its rejection (an unhandled
 * rejection kills the process) and its ordering (the next statement runs before it settles), so
 * every promise is handled. Two rules:
 *
 * - `floating`: an expression statement whose type is a promise (or any thenable, or a union with
 *   one) must be awaited, returned, voided (`void x`, saying "nobody waits, on purpose"), or end in
 *   `.catch(handler)` or `.then(onFulfilled, onRejected)`. An assignment is not a statement of
 *   this kind (the promise is kept).
 * - `void-callback`: a function that returns a promise (an `async` callback), passed where the
 *   parameter's type wants a function returning `void` (an event handler, `setTimeout`, `forEach`):
 *   whoever calls it drops the promise. Give it its own `.catch` (e.g.
 *   `() => void work().catch(log)`).
 */
import path from 'node:path';
import ts from 'typescript';

/** One offence: where, and which rule. */
export interface FloatingPromise {
  /** Path relative to the project root. */
  file: string;
  /** 1-based. */
  line: number;
  rule: 'floating' | 'void-callback';
  /** The expression's text, shortened. */
  text: string;
}

/** Whether `type` (or one member of a union) has a callable `then`: a promise or a thenable. */
function isThenable(checker: ts.TypeChecker, type: ts.Type, node: ts.Node): boolean {
  for (const t of type.isUnion() ? type.types : [type]) {
    if (t.flags & (ts.TypeFlags.Any | ts.TypeFlags.Unknown)) continue;
    const then = t.getProperty('then');
    if (!then) continue;
    if (checker.getTypeOfSymbolAtLocation(then, node).getCallSignatures().length > 0) return true;
  }
  return false;
}

/** Whether calling `expr` handles a rejection: `p.catch(f)` or `p.then(f, g)` (optional chains too). */
function handlesRejection(expr: ts.Expression): boolean {
  if (!ts.isCallExpression(expr)) return false;
  const callee = expr.expression;
  if (!ts.isPropertyAccessExpression(callee)) return false;
  const name = callee.name.text;
  return (name === 'catch' && expr.arguments.length >= 1) || (name === 'then' && expr.arguments.length >= 2);
}

/** Whether every call signature of `type` returns `void` (not `any`, `unknown`, or a promise). */
function wantsVoidReturn(checker: ts.TypeChecker, type: ts.Type): boolean {
  const signatures = (type.isUnion() ? type.types : [type]).flatMap((t) => t.getCallSignatures());
  if (signatures.length === 0) return false;
  return signatures.every((s) => {
    const r = checker.getReturnTypeOfSignature(s);
    return (r.flags & ts.TypeFlags.Void) !== 0 && !r.isUnion();
  });
}

/** Whether `fn` (a function argument) returns a promise on some path. */
function returnsThenable(checker: ts.TypeChecker, type: ts.Type, node: ts.Node): boolean {
  return type.getCallSignatures().some((s) => isThenable(checker, checker.getReturnTypeOfSignature(s), node));
}

function shorten(text: string): string {
  const one = text.replace(/\s+/g, ' ').trim();
  return one.length > 100 ? `${one.slice(0, 97)}...` : one;
}

/**
 * The floating promises of `program`'s source files (declaration files and node_modules aside).
 *
 * @param root - the project root the reported paths are relative to
 * @param include - which files to check (by absolute path); every file when omitted
 */
export function findFloatingPromises(program: ts.Program, root: string, include: (file: string) => boolean = () => true): FloatingPromise[] {
  const checker = program.getTypeChecker();
  const found: FloatingPromise[] = [];
  for (const sf of program.getSourceFiles()) {
    if (sf.isDeclarationFile || sf.fileName.includes('/node_modules/') || !include(sf.fileName)) continue;
    const report = (node: ts.Node, rule: FloatingPromise['rule']) => {
      const { line } = sf.getLineAndCharacterOfPosition(node.getStart(sf));
      found.push({ file: path.relative(root, sf.fileName) || sf.fileName, line: line + 1, rule, text: shorten(node.getText(sf)) });
    };
    const visit = (node: ts.Node): void => {
      if (ts.isExpressionStatement(node)) {
        let expr = node.expression;
        while (ts.isParenthesizedExpression(expr)) expr = expr.expression;
        const handled =
          ts.isAwaitExpression(expr) ||
          ts.isVoidExpression(expr) ||
          ts.isYieldExpression(expr) ||
          (ts.isBinaryExpression(expr) && expr.operatorToken.kind >= ts.SyntaxKind.FirstAssignment && expr.operatorToken.kind <= ts.SyntaxKind.LastAssignment) ||
          handlesRejection(expr);
        if (!handled && isThenable(checker, checker.getTypeAtLocation(expr), expr)) report(node, 'floating');
      }
      if ((ts.isCallExpression(node) || ts.isNewExpression(node)) && node.arguments) {
        for (const arg of node.arguments) {
          if (!ts.isArrowFunction(arg) && !ts.isFunctionExpression(arg)) continue;
          const contextual = checker.getContextualType(arg);
          if (!contextual || !wantsVoidReturn(checker, contextual)) continue;
          if (returnsThenable(checker, checker.getTypeAtLocation(arg), arg)) report(arg, 'void-callback');
        }
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }
  return found;
}

/** The program of a tsconfig file (its files and options), for {@link findFloatingPromises}. */
export function programOf(configFiles: string[]): ts.Program {
  const rootNames = new Set<string>();
  let options: ts.CompilerOptions | undefined;
  for (const configFile of configFiles) {
    const parsed = ts.getParsedCommandLineOfConfigFile(configFile, {}, {
      ...ts.sys,
      onUnRecoverableConfigFileDiagnostic: (d) => {
        throw new Error(ts.flattenDiagnosticMessageText(d.messageText, '\n'));
      },
    });
    if (!parsed) throw new Error(`cannot read ${configFile}`);
    options ??= parsed.options;
    for (const f of parsed.fileNames) rootNames.add(f);
  }
  return ts.createProgram({ rootNames: [...rootNames], options: { ...options, noEmit: true } });
}

/** {@link findFloatingPromises} of one in-memory source file (`check.ts`), for the checker's own tests. */
export function checkSource(code: string): FloatingPromise[] {
  const fileName = '/virtual/check.ts';
  const options: ts.CompilerOptions = { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext, strict: true, lib: ['lib.es2022.d.ts'], types: [], noEmit: true };
  const host = ts.createCompilerHost(options);
  const getSourceFile = host.getSourceFile.bind(host);
  host.getSourceFile = (name, lang, ...rest) => (name === fileName ? ts.createSourceFile(name, code, lang, true) : getSourceFile(name, lang, ...rest));
  const fileExists = host.fileExists.bind(host);
  host.fileExists = (name) => name === fileName || fileExists(name);
  const program = ts.createProgram({ rootNames: [fileName], options, host });
  return findFloatingPromises(program, '/virtual');
}
