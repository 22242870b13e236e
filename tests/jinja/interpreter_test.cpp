// The Jinja interpreter's semantics one feature at a time, each expected output as Python's
// jinja2 (trim_blocks, lstrip_blocks, Transformers' tojson) gives it.
#include <gtest/gtest.h>

#include <ctime>
#include <string>

#include "jinja/template.h"

namespace fdl::jinja {
namespace {

std::string render(const std::string& src, const std::string& vars_json = "{}") {
  RenderOptions opt;
  opt.clock = [] {
    std::tm t{};
    t.tm_year = 2026 - 1900, t.tm_mon = 11, t.tm_mday = 2, t.tm_hour = 9, t.tm_min = 30;
    std::mktime(&t);
    return t;
  };
  return Template(src).render(chat_context(nlohmann::ordered_json::parse(vars_json)), opt);
}

std::string error_of(const std::string& src, const std::string& vars_json = "{}") {
  try {
    render(src, vars_json);
  } catch (const TemplateError& e) {
    return e.what();
  }
  return "(rendered)";
}

TEST(Jinja, WhitespaceControlTrimsAndLstrips) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("{% if true %}\nx\n{% endif %}\ny"), "x\ny");          // trim_blocks
  EXPECT_EQ(render("  {% if true %}x{% endif %}"), "x");                  // lstrip_blocks
  EXPECT_EQ(render("a  {% if true %}x{% endif %}"), "a  x");              // not at a line start
  EXPECT_EQ(render("  {%+ if true %}x{% endif %}"), "  x");               // + keeps the indent
  EXPECT_EQ(render("a{# note #}\nb"), "ab");                               // comments trim too
  EXPECT_EQ(render("{{ 'x' }}\ny"), "x\ny");                               // not after }}
  EXPECT_EQ(render("{% raw %}{{ not }}{% endraw %}"), "{{ not }}");
}

TEST(Jinja, LoopsScopesAndNamespaces) {
  EXPECT_EQ(render("{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
            "11,22,33");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1,2,3,4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"), "2242");
  EXPECT_EQ(render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "1");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  // A set inside a loop stays there; a namespace carries the value out.
  EXPECT_EQ(render("{% set n = 0 %}{% for x in [1,2] %}{% set n = n + x %}{% endfor %}{{ n }}"), "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for x in [1,2] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render("{% for x in 'ab' %}{{ loop.previtem is defined }}{{ x }}{% endfor %}"), "FalseaTrueb");
}

TEST(Jinja, MacrosAndCallBlocks) {
  EXPECT_EQ(render("{% macro greet(name, mark='!') %}Hi {{ name }}{{ mark }}{% endmacro %}{{ greet('Ann') }}{{ greet('Bo', mark='?') }}"),
            "Hi Ann!Hi Bo?");
  EXPECT_EQ(render("{% macro wrap() %}[{{ caller() }}]{% endmacro %}{% call wrap() %}in{% endcall %}"), "[in]");
  EXPECT_EQ(render("{% set x %}a{{ 1 + 1 }}{% endset %}{{ x }}"), "a2");
  EXPECT_EQ(render("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(Jinja, ValuesPrintAsPythonDoes) {
  EXPECT_EQ(render("{{ none }} {{ true }} {{ 1.0 }} {{ 1e-5 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }}"),
            "None True 1.0 1e-05 3 -4 3.5 2");
  EXPECT_EQ(render("{{ ['a', 1, none, {'k': \"it's\"}] }}"), "['a', 1, None, {'k': \"it's\"}]");
  EXPECT_EQ(render("{{ 'abcdef'[1:4] }}{{ 'abc'[::-1] }}{{ [1,2,3][-1] }}"), "bcdcba3");
  EXPECT_EQ(render("{{ 'x' ~ 1 ~ none }}"), "x1None");
  EXPECT_EQ(render("{{ 'Café'|length }}"), "4");  // code points, not bytes
}

TEST(Jinja, TojsonAsTransformersDefinesIt) {
  const std::string vars = R"({"v": {"b": [1, 2.5, true, null], "a": "é\"\n"}})";
  EXPECT_EQ(render("{{ v|tojson }}", vars), R"({"b": [1, 2.5, true, null], "a": "é\"\n"})");
  EXPECT_EQ(render("{{ v|tojson(indent=2) }}", vars),
            "{\n  \"b\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"a\": \"é\\\"\\n\"\n}");
  EXPECT_EQ(render("{{ v|tojson(sort_keys=true) }}", vars), R"({"a": "é\"\n", "b": [1, 2.5, true, null]})");
  EXPECT_EQ(render("{{ v|tojson(separators=(',', ':')) }}", vars), R"({"b":[1,2.5,true,null],"a":"é\"\n"})");
}

TEST(Jinja, FiltersTestsAndMethods) {
  const std::string vars = R"({"people": [{"name": "b", "age": 3}, {"name": "a", "age": 5}, {"name": "c"}]})";
  EXPECT_EQ(render("{{ people|map(attribute='name')|join(',') }}", vars), "b,a,c");
  EXPECT_EQ(render("{{ people|selectattr('age', 'defined')|map(attribute='name')|list }}", vars), "['b', 'a']");
  EXPECT_EQ(render("{{ people|rejectattr('age')|list|length }}", vars), "1");
  EXPECT_EQ(render("{{ people|sort(attribute='name')|map(attribute='name')|join }}", vars), "abc");
  EXPECT_EQ(render("{{ {'b': 1, 'A': 2}|dictsort }}{{ (1,) }}"), "[('A', 2), ('b', 1)](1,)");
  EXPECT_EQ(render("{{ ''|default('d') }}{{ ''|default('d', true) }}{{ missing|default('m') }}"), "dm");
  EXPECT_EQ(render("{{ 'a\nb'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}"), "a\n  b|  a\n  b");
  EXPECT_EQ(render("{{ '  x  '|trim }}{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}"), "x['a', 'b', '', 'c']['a', 'b']");
  EXPECT_EQ(render("{{ 'Hello'.startswith(('x', 'He')) }}{{ 'abc'.replace('b', 'B') }}{{ '{}-{x}'.format(1, x=2) }}"),
            "TrueaBc1-2");
  EXPECT_EQ(render("{{ 3 is odd }}{{ 'a' is string }}{{ {} is mapping }}{{ none is none }}{{ 4 is divisibleby 2 }}"),
            "TrueTrueTrueTrueTrue");
  EXPECT_EQ(render("{{ 'b' in 'abc' }}{{ 2 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}"), "TrueTrueTrueTrue");
  EXPECT_EQ(render("{{ strftime_now('%d %b %Y') }}"), "02 Dec 2026");
}

// markupsafe: Markup + str escapes the plain side; a generator has no len() and no JSON form.
TEST(Jinja, MarkupAndGeneratorsBehaveAsInJinja2) {
  EXPECT_EQ(render("{{ 'a'|safe + '<\"b\">' }}"), "a&lt;&#34;b&#34;&gt;");
  EXPECT_EQ(render("{{ [1,2]|map('string')|list }}"), "['1', '2']");
  EXPECT_NE(error_of("{{ [1,2]|map('string')|tojson }}").find("generator is not JSON serializable"), std::string::npos);
  EXPECT_NE(error_of("{{ [1]|select|length }}").find("has no len()"), std::string::npos);
  EXPECT_EQ(render("{{ none|selectattr('x')|list }}"), "[]");  // a false sequence filters to nothing
}

TEST(Jinja, ErrorsNameTheProblem) {
  EXPECT_NE(error_of("{% if x %}").find("missing 'endif'"), std::string::npos);
  EXPECT_NE(error_of("line\n{{ 1 + }}").find("line 2"), std::string::npos);
  EXPECT_NE(error_of("{% frobnicate %}").find("unknown statement 'frobnicate'"), std::string::npos);
  EXPECT_EQ(error_of("{{ raise_exception('Only user and assistant roles') }}"), "Only user and assistant roles");
  EXPECT_NE(error_of("{{ missing.attr }}").find("'missing' is undefined"), std::string::npos);
  EXPECT_NE(error_of("{{ m.a.b }}", R"({"m": {}})").find("has no attribute 'a'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'a' + 1 }}").find("can only concatenate str"), std::string::npos);
  EXPECT_NE(error_of("{{ x|nosuchfilter }}").find("no filter named 'nosuchfilter'"), std::string::npos);
  EXPECT_NE(error_of("{{ 1 is nosuchtest }}").find("no test named 'nosuchtest'"), std::string::npos);
  EXPECT_THROW(chat_context(nlohmann::ordered_json::parse("[1]")), TemplateError);
  EXPECT_THROW(chat_context(nlohmann::ordered_json::parse(R"({"messages": "hi"})")), TemplateError);
}

// The sandbox: lists and dicts are immutable, and no template can run away with memory or
// recursion.
TEST(Jinja, SandboxRefusesMutationAndRunaways) {
  EXPECT_NE(error_of("{% set l = [1] %}{{ l.append(2) }}").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ m.update({'a': 1}) }}", R"({"m": {}})").find("unsafe"), std::string::npos);
  EXPECT_NE(error_of("{{ range(10000000)|length }}").find("too large"), std::string::npos);
  EXPECT_NE(error_of("{{ 'x' * 100000000 }}").find("64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").find("nest deeper"), std::string::npos);
}

// Jinja2 and Python behaviours real templates reach beyond the reference set.
TEST(Jinja, PythonAndJinja2Details) {
  const std::string tool = R"({"p": {"items": {"type": "string"}, "keys": 1}})";
  EXPECT_EQ(render("{% for k, v in p.items() %}{{ k }};{% endfor %}{{ p['items'].type }}", tool), "items;keys;string");
  EXPECT_EQ(render("{{ 'é☕'|tojson(ensure_ascii=true) }}|{{ 'é'|tojson }}|{{ [1]|tojson(false, 1) }}"),
            "\"\\u00e9\\u2615\"|\"é\"|[\n 1\n]");
  EXPECT_EQ(render("{{ {'a': {'b': 1}} }}"), "{'a': {'b': 1}}");
  EXPECT_EQ(render("{{ 0 < 5 < 3 }}{{ 1 < 2 < 3 }}{{ 2 == 2 == 1 }}"), "FalseTrueFalse");
  EXPECT_EQ(render("{{ 'a\n  \nb'|indent(2) }}|{{ 'a\n'|indent(2) }}"), "a\n    \n  b|a\n");
  EXPECT_EQ(render("{{ '3.7'|int }}{{ 'x'|int }}{{ '%s' % [1, 2] }}{{ '%s-%s' % (1, 2) }}"), "30[1, 2]1-2");
  EXPECT_EQ(render("{{ none['x'] is defined }}{{ 5['a'] is defined }}"), "FalseFalse");
  EXPECT_EQ(render("a{{ 1 }}\n"), "a1");         // one trailing newline dropped
  EXPECT_EQ(render("a\r\nb\rc"), "a\nb\nc");  // line endings become \n
}

// Malformed or hostile templates end in a TemplateError, never a crash, a hang or a runaway.
TEST(Jinja, HostileTemplatesAreRefusedCleanly) {
  EXPECT_NE(error_of("{{ " + std::string(300, '(') + "1" + std::string(300, ')') + " }}").find("nest deeper"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(300, '[') + std::string(300, ']') + " }}").find("nest deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(300, '[') + " }}").find("not closed"), std::string::npos);
  std::string ifs;
  for (int i = 0; i < 300; ++i) ifs += "{% if true %}";
  EXPECT_NE(error_of(ifs).find("nest deeper"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(error_of("{{ " + nots + "1 }}").find("nest deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ (-9223372036854775807 - 1) // -1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 10 ** 20 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
  EXPECT_NE(error_of("{{ 'abcd' * 4611686018427387904 }}").find("64 MiB"), std::string::npos);
  EXPECT_NE(error_of("{{ [1, 2] * 4611686018427387904 }}").find("too long"), std::string::npos);
  EXPECT_NE(error_of("{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}")
                .find("64 MiB"),
            std::string::npos);
  EXPECT_NE(error_of("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}").find("too much work"),
            std::string::npos);
  EXPECT_NE(error_of("{{ range(1.5) }}").find("integer is required"), std::string::npos);
  EXPECT_EQ(render("{{ 'x'|center(9223372036854775807)|length }}"), "1048576");  // widths are capped
  EXPECT_NE(error_of("{% break %}").find("outside a for loop"), std::string::npos);
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("not more than 1"), std::string::npos);
  EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(b=2) }}").find("no keyword argument 'b'"), std::string::npos);
  EXPECT_NE(error_of("{{ 'unterminated }}").find("not closed"), std::string::npos);
  EXPECT_NE(error_of("{{ x").find("not closed"), std::string::npos);
  // The fuzzer's findings: a list where a string belongs, a namespace holding itself.
  EXPECT_NE(error_of("{{ ' x '|trim([1]) }}").find("a string is required"), std::string::npos);
  EXPECT_NE(render("{% set ns = namespace(a=1) %}{% set ns.me = ns %}{{ ns }}").find("..."), std::string::npos);
}

// Lists and namespaces are shared, so a short template can build a value whose walk is
// exponential: each such walk is charged to the rendering's budget and ends in a TemplateError
// within a second, never a hang.
TEST(Jinja, ExponentialWalksOverSharedValuesAreBounded) {
  const std::string doubled = "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}";
  for (const std::string walk : {"{{ ns.l }}", "{{ ns.l|tojson }}"})
    EXPECT_NE(error_of(doubled + walk).find("too much work with its values"), std::string::npos) << walk;
  // Two such lists built apart share nothing with each other: comparing them walks them.
  const std::string two = "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
                          "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
  EXPECT_NE(error_of(two + "{{ ns.a == ns.b }}").find("too much work with its values"), std::string::npos);
  EXPECT_NE(error_of(two + "{{ ns.a < ns.b }}").find("too much work with its values"), std::string::npos);
  // The error names the line of the statement that did the work, and raise_exception's text stays as written.
  EXPECT_NE(error_of(doubled + "\n\n{{ ns.l }}").find("too much work with its values: printing, serializing, comparing"),
            std::string::npos);
  EXPECT_NE(error_of(doubled + "\n\n{{ ns.l }}").find("(template line 3)"), std::string::npos);
  EXPECT_EQ(error_of("\n{{ raise_exception('roles must alternate') }}"), "roles must alternate");
  // The same list compares equal to itself without a walk, as in Python.
  EXPECT_EQ(render(doubled + "{{ ns.l == ns.l }}{{ ns.l in [ns.l] }}"), "TrueTrue");
  // A namespace holding itself twice prints as deep as the depth bound allows: 2^64 paths.
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns.a = ns %}{% set ns.b = ns %}{{ ns }}").find("too much work"),
            std::string::npos);
  // A walk over a large list inside a long loop; its length, a constant-time filter, is free.
  EXPECT_NE(error_of("{% set l = range(100000)|list %}{% for i in range(1000) %}{{ l|sum }}{% endfor %}")
                .find("too much work with its values"),
            std::string::npos);
  EXPECT_EQ(render("{% set l = range(100000)|list %}{% for i in range(10000) %}{{ l|length if loop.last }}{% endfor %}"),
            "100000");
  // Output that grows from small inputs: format fields, joins, replacements, % formatting.
  for (const std::string grow : {"{{ ('{0}' * 100000).format('x' * 10000000) }}",
                                 "{{ (['x' * 10000000] * 100)|join('x') }}",
                                 "{{ ('a' * 100000)|replace('a', 'b' * 10000) }}",
                                 "{{ ('%s' * 10) % (('x' * 10000000,) * 10) }}"})
    EXPECT_NE(error_of(grow).find("64 MiB"), std::string::npos) << grow;
  // Empty sequences repeated any number of times, and searches in repetitive text, are quick.
  EXPECT_EQ(render("{{ '' * 4611686018427387904 }}{{ ([] * 4611686018427387904)|length }}"), "0");
  EXPECT_EQ(render("{% set h = 'a' * 4000000 %}{{ ('a' * 2000000 ~ 'b') in h }}{{ h.count('a' * 1000 ~ 'b') }}"),
            "False0");
  // Lists nested deeper than JSON input may be are refused by every walk, not recursed into.
  const std::string deep = "{% set ns = namespace(a=[], b=[]) %}{% for i in range(5000) %}"
                           "{% set ns.a = [ns.a] %}{% set ns.b = [ns.b] %}{% endfor %}";
  for (const std::string walk : {"{{ ns.a == ns.b }}", "{{ ns.a < ns.b }}", "{{ ns.a|tojson }}"})
    EXPECT_NE(error_of(deep + walk).find("nested more than 512 deep"), std::string::npos) << walk;
  EXPECT_NE(render(deep + "{{ ns.a }}").find("..."), std::string::npos);  // repr stops at its depth
  // A list shared many times over orders against itself without a walk.
  EXPECT_EQ(render(doubled + "{{ ns.l < ns.l }}{{ [ns.l] < [ns.l, 1] }}"), "FalseTrue");
  // A real template's work stays within the budget, even four hundred messages of 1 KiB joined
  // by concatenation (quadratic copying: 80 MB in all).
  std::string messages = R"({"messages": [)";
  for (int i = 0; i < 400; ++i) messages += std::string(i ? "," : "") + R"({"role": "user", "content": ")" + std::string(1024, 'a') + "\"}";
  messages += "]}";
  EXPECT_EQ(render("{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content|trim %}{% endfor %}"
                   "{{ ns.s|length }}",
                   messages),
            "409600");
}

}  // namespace
}  // namespace fdl::jinja

namespace fdl::jinja {
namespace {

TEST(JinjaValue, JsonNestedTooDeepIsATemplateErrorNotACrash) {
  nlohmann::ordered_json deep = nlohmann::ordered_json::array();
  for (int i = 0; i < 20000; ++i) deep = nlohmann::ordered_json::array({std::move(deep)});
  EXPECT_THROW(Value::from_json(deep), TemplateError);
  nlohmann::ordered_json ok = nlohmann::ordered_json::array();
  for (int i = 0; i < 100; ++i) ok = nlohmann::ordered_json::array({std::move(ok)});
  EXPECT_NO_THROW(Value::from_json(ok));
}

}  // namespace
}  // namespace fdl::jinja
